"""The local runner: `plan()`'s WorkerLaunches as processes around an embedded nats-server.

There is no second way of wiring the system: each launch's command and env are used as
the operator would put them in a Pod (`$(VAR)` expanded the same way), with five local
additions: the process is named like its pod (POLYRL_POD_NAME), it is a NATS user with only
its role's permissions, signed by the run's own trust (`polyrl.api.natsjwt`, as the operator
signs a pod's user; the run's admin user, which creates the streams, is in
`<run>/nats/admin.creds`), workers write metrics and
checkpoints into the run directory, torch uses one thread per process (on a small machine,
more threads per process only contend), the job file's directory (`code_dir`) comes first
on PYTHONPATH, so a workflow module beside the job file is found (on a cluster it is in the
worker image), and vLLM rollout workers run in the vLLM environment (on a cluster, the vLLM
worker image; `environments`). Every process is tracked by PID, in its own process group,
and stopped on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import nats

from polyrl.api import access, natsconfig, natsjwt, plan
from polyrl.api.launch import (
    MODEL_CACHE_ENV,
    NATS_CREDS_ENV,
    POD_NAME_ENV,
    TERMINATION_LOG_ENV,
    Role,
    WorkerLaunch,
)
from polyrl.api.naming import JobNames
from polyrl.api.resources import RLJob
from polyrl.local import environments, processes
from polyrl.local.natsserver import NatsServer
from polyrl.local.podenv import expand

# Consumers before what they consume. A workflow runner given SIGTERM lets its in-flight
# episodes finish (up to its 20 s drain timeout), which needs the rollout workers still
# answering: stopped all together, every quick start ended by waiting out that timeout for
# replies that could no longer come (23 s from the trainers' exit to the end of the run).
STOP_ORDER = (Role.WORKFLOW, Role.ROLLOUT, Role.PUBLISHER, Role.TRAINER)
STOP_GRACE = 20.0
CAUSE_LINES = 5  # of a failed process's log, when it left no termination message


@dataclass
class LocalRun:
    job: RLJob
    run_dir: Path
    procs: dict[str, processes.Managed] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    nats: NatsServer | None = None
    code_dir: Path | None = None
    """Put first on the workers' PYTHONPATH: where the job's own workflow module lives."""
    vllm_env: Path | None = None
    """The environment vLLM rollout workers run in (`environments.vllm_env`)."""
    trust: natsjwt.Trust = field(default_factory=natsjwt.Trust.new)
    """The embedded server's trust: each worker is a user with only its role's subjects."""

    @property
    def metrics(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def admin_creds(self) -> Path:
        """The run's admin user (every subject): for the nats CLI or a script, while it runs."""
        return self.run_dir / "nats" / "admin.creds"

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.nats = NatsServer(self.run_dir / "nats", trust=self.trust)
        self.nats.start()
        self.admin_creds.write_text(self.trust.signer.user_creds("admin", access.ADMIN))
        self.admin_creds.chmod(0o600)
        asyncio.run(self._create_streams(self.nats.url))
        for launch in plan.plan(self.job, nats_url=self.nats.url).launches:
            self._spawn(launch)

    async def _create_streams(self, url: str) -> None:
        """What the operator does for a job on a cluster: the workers' users may not."""
        nc = await nats.connect(url, user_credentials=str(self.admin_creds))
        try:
            await natsconfig.ensure(nc.jetstream(), self.names, self.policies)
        finally:
            await nc.close()

    @property
    def names(self) -> JobNames:
        return JobNames(namespace=self.job.metadata.namespace, job=self.job.metadata.name)

    @property
    def policies(self) -> list[str]:
        return [p.name for p in self.job.spec.policies]

    def _user(self, launch: WorkerLaunch) -> str:
        """A creds file for `launch`'s role and policy, as the operator signs for a pod."""
        served: list[str] = []
        if launch.role == Role.ROLLOUT and launch.policy is not None:
            served = self.job.spec.served_in_pool(launch.policy)[1:]
        grant = access.grant(self.names, launch.role, launch.policy, self.policies, served=served)
        return self.trust.signer.user_creds(launch.name, grant)

    def _spawn(self, launch: WorkerLaunch) -> None:
        env = {
            **os.environ,
            **launch.env,
            POD_NAME_ENV: launch.name,
            NATS_CREDS_ENV: self._user(launch),
            "POLYRL_NAMESPACE": self.job.metadata.namespace,
            "POLYRL_METRICS_FILE": str(self.metrics),
            TERMINATION_LOG_ENV: str(self.termination_log(launch.name)),
            "POLYRL_TRAINER_DIR": str(self.run_dir / "trainers"),
            MODEL_CACHE_ENV: os.environ.get(MODEL_CACHE_ENV) or str(_user_model_cache()),
            "POLYRL_TORCH_THREADS": os.environ.get("POLYRL_TORCH_THREADS", "1"),
            "OMP_NUM_THREADS": "1",
            "PATH": environments.path_for(launch, self.job, self.vllm_env),
        }
        if self.code_dir is not None:
            paths = [str(self.code_dir), env.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        argv = [expand(part, env) for part in launch.command]
        self.procs[launch.name] = processes.start(
            launch.name, argv, log=self.run_dir / "logs" / f"{launch.name}.log", env=env
        )
        self.roles[launch.name] = str(launch.role)

    def termination_log(self, name: str) -> Path:
        """Where process `name` writes why it stopped (a pod's /dev/termination-log)."""
        return self.run_dir / "logs" / f"{name}.termination"

    def cause(self, name: str) -> str:
        """Why `name` stopped: its termination message, else the last lines of its log."""
        with contextlib.suppress(OSError):
            said = self.termination_log(name).read_text().strip()
            if said:
                return said
        return processes.tail(self.procs[name].log, CAUSE_LINES).strip() or "no output"

    def trainers_done(self) -> bool:
        trainers = [p for n, p in self.procs.items() if self.roles[n] == Role.TRAINER]
        return bool(trainers) and not any(p.alive() for p in trainers)

    def failed(self) -> list[str]:
        """Processes that exited with an error (a trainer's clean exit is not a failure)."""
        bad = []
        for name, proc in self.procs.items():
            code = proc.popen.poll() if proc.popen is not None else None
            if code not in (None, 0):
                bad.append(f"{name} exited {code}: {self.cause(name)}\n  (log: {proc.log})")
        return bad

    def stop(self) -> None:
        """Every process, in `STOP_ORDER`, each role given `STOP_GRACE` seconds; then NATS."""
        for role in STOP_ORDER:
            group = [proc for name, proc in self.procs.items() if self.roles[name] == role]
            processes.stop_all(group, grace=STOP_GRACE)
        if self.nats is not None:
            self.nats.stop()
            self.nats = None


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: stop everything cleanly."""


def install_signal_handlers() -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def wait(run: LocalRun, *, poll: float = 1.0, on_tick: object = None) -> None:
    """Until every trainer has exited; raises, with each cause, once any process failed (a
    trainer that failed included)."""
    while True:
        if failed := run.failed():
            raise RuntimeError("a worker failed: " + "\n".join(failed))
        if run.trainers_done():
            return
        if callable(on_tick):
            on_tick()
        time.sleep(poll)


def _user_model_cache() -> Path:
    """`$POLYRL_CACHE/models` (default ~/.cache/polyrl/models): what `polyrl models fetch`
    fills, and where a GGUF file converted once serves every later run."""
    root = os.environ.get("POLYRL_CACHE") or Path.home() / ".cache" / "polyrl"
    return Path(root) / "models"
