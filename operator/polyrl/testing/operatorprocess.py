"""The operator as a process of its own, for the tests and the benchmarks.

Both need `python -m polyrl.operator` against a local control plane and nats-server, the way
a cluster runs it: in its own process, started and stopped by PID (never by name), answering
its liveness probe before anyone relies on it, its log in a file that a failure can quote,
its Prometheus metrics on a port of its own. The integration and end-to-end tests keep one
for the whole session and restart it when a test needs its pods to run other workers
(`use`); `polyrl bench operator` starts one per run and reads its counters. So there is one
launcher, here, and each caller says what differs: peering (two operators in one peering
pause each other; without one the operator runs `--standalone`), the settings it runs with
(`defaults`, env such as POLYRL_STATUS_INTERVAL), the workers its pods run, and the NATS
signing Secret, without which it runs with POLYRL_NATS_INSECURE (it refuses to start with
neither).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from polyrl.local import processes
from polyrl.testing.waiting import wait_until

# Pods inherit the node agent's environment; on a small machine more than one torch thread
# per process only contends (as in `polyrl run`), so real workers get one through their env.
ONE_THREAD = "env OMP_NUM_THREADS=1 POLYRL_TORCH_THREADS=1"
RECONCILES = "polyrl_operator_reconciles_total"


@dataclass(frozen=True, slots=True)
class Workers:
    """What the operator's pods run: `<worker> rollout|workflow` (POLYRL_WORKER_COMMAND) and
    torchrun's `<trainer>` (POLYRL_TRAINER_ENTRY)."""

    name: str
    worker: str
    trainer: str


REAL_WORKERS = Workers(
    "real", worker=f"{ONE_THREAD} polyrl worker", trainer="-m polyrl.workers.trainer"
)


class OperatorProcess:
    """`python -m polyrl.operator`, tracked by PID, restartable."""

    def __init__(
        self,
        kubeconfig_path: Path,
        nats_url: str,
        workdir: Path,
        *,
        workers: Workers,
        peering: str | None = None,
        defaults: Mapping[str, str] | None = None,
        signing_secret: str | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig_path
        self.nats_url = nats_url
        self.workdir = workdir
        self.workers = workers
        self.peering = peering  # None: --standalone
        self.defaults = dict(defaults or {})  # operator settings (env) of every start
        self.signing_secret = signing_secret
        self.settings: dict[str, str] = {}  # over the defaults, until the next `use`
        self.proc: processes.Managed | None = None
        self.starts = 0
        self.liveness_port = 0
        self.metrics_port = 0  # the running operator's Prometheus metrics (`passes`)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the operator is not running"
        return self.proc.pid

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def env(self) -> dict[str, str]:
        signing = (
            {"POLYRL_NATS_SIGNING_SECRET": self.signing_secret}
            if self.signing_secret
            else {"POLYRL_NATS_INSECURE": "true"}
        )
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "POLYRL_NATS_URL": self.nats_url,
            "POLYRL_WORKER_COMMAND": self.workers.worker,
            "POLYRL_TRAINER_ENTRY": self.workers.trainer,
            **self.defaults,
            **signing,
            **self.settings,
        }

    def argv(self) -> list[str]:
        peering = ["--peering", self.peering] if self.peering else ["--standalone"]
        return [
            sys.executable,
            "-m",
            "polyrl.operator",
            *peering,
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--metrics-port",
            str(self.metrics_port),
        ]

    def start(self, *, wait: bool = True) -> None:
        """Start it; unless `wait` is False (then call `wait_live`), until it is live."""
        self.liveness_port, self.metrics_port = processes.free_port(), processes.free_port()
        self.starts += 1
        self.proc = processes.start(
            "operator",
            self.argv(),
            log=self.workdir / f"operator-{self.starts}.log",
            env=self.env(),
        )
        if wait:
            self.wait_live()

    def wait_live(self) -> None:
        """Until its liveness probe answers; fail at once, with its log, if it exits."""
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        wait_until("the operator's liveness probe", lambda: _live(url, self.proc), timeout=60)

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (its process group, by PID)."""
        if self.proc is not None:
            processes.stop(self.proc, grace=grace)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL the operator (by its PID's process group): no shutdown, no cleanup."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            processes.stop(self.proc, grace=0)  # reaps it
            self.proc = None

    def use(self, workers: Workers, *, settings: dict[str, str] | None = None) -> None:
        """Make the operator's pods run `workers`, with `settings` (env such as
        POLYRL_NATS_USER_TTL) over the defaults, restarting it if it runs otherwise."""
        settings = dict(settings or {})
        if workers != self.workers or settings != self.settings or self.proc is None:
            self.workers, self.settings = workers, settings
            self.restart()

    def log(self) -> str:
        assert self.proc is not None
        return self.proc.log.read_text(errors="replace")

    def passes(self, kind: str) -> float:
        """Reconcile passes of `kind` (rljob, policygroup) this operator process completed:
        its own counter `polyrl_operator_reconciles_total{kind}`."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == RECONCILES and sample.labels.get("kind") == kind:
                    return float(sample.value)
        return 0.0

    def wait_passes(self, kind: str, count: int, *, timeout: float = 60.0) -> None:
        """Until this operator has completed `count` more passes of `kind` than it had now.
        A pass under way now ends within them, so two mean one begun after this call."""
        target = self.passes(kind) + count
        wait_until(
            f"{count} more {kind} reconcile passes (the counter at {target:.0f})",
            lambda: self.passes(kind) >= target,
            timeout=timeout,
        )


def _live(url: str, proc: processes.Managed | None) -> bool:
    if proc is None or not proc.alive():
        raise RuntimeError(f"the operator exited:\n{processes.tail(proc.log) if proc else ''}")
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
