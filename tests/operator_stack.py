"""The operator under test, shared by the integration and end-to-end tests.

It runs as its own process (`polyrl.testing.operatorprocess`, shared with the operator
benchmark) with a token of the Helm chart's ServiceAccount, so a verb missing from the chart
fails a test. What its pods run is chosen by `POLYRL_WORKER_COMMAND` and
`POLYRL_TRAINER_ENTRY` (`Workers`): the FAKE worker (`tests/fakes/fake_worker.py`) for
control-plane tests, or the real workers. There is only ever one operator process (two
would pause each other through kopf peering), so a test that needs other workers restarts
it with them (`OperatorProcess.use`); the node agent runs a pod's command only in namespaces
labelled `agent.polyrl.dev/mode=exec`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import yaml

from polyrl.local import processes
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl
from polyrl.testing.nodeagent.runner import deleted_pod_logs
from polyrl.testing.operatorprocess import REAL_WORKERS, OperatorProcess, Workers
from polyrl.testing.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
FAKE_WORKER = REPO / "tests" / "fakes" / "fake_worker.py"
# The test operators peer under their own name: the chart's peering (`polyrl`) belongs to
# whichever Helm release installs it (test_chart.py installs the chart into this cluster).
PEERING = "polyrl-tests"
OPERATOR_NS = "polyrl-system"
# Status every second and short bounds, so that tests see them act.
SETTINGS = {
    "POLYRL_NAMESPACE": OPERATOR_NS,
    "POLYRL_STATUS_INTERVAL": "1",
    "POLYRL_STATUS_PROGRESS_INTERVAL": "1",
    "POLYRL_CLEANUP_TIMEOUT": "4",
    "POLYRL_NATS_TIMEOUT": "2",
}

_FAKE = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_WORKER))}"
FAKE_WORKERS = Workers("fake", worker=_FAKE, trainer=str(FAKE_WORKER))
# Real rollout and workflow workers with the fake trainer: the test publishes the model
# bundle and the weights itself, and nothing trains.
REAL_ROLLOUTS = Workers("real-rollouts", worker=REAL_WORKERS.worker, trainer=str(FAKE_WORKER))


def operator_process(
    kubeconfig_path: Path, nats_url: str, workdir: Path, *, signing_secret: str | None = None
) -> OperatorProcess:
    """An operator as the tests run it, not started: in the tests' peering, with their
    `SETTINGS`, its pods running the fake worker until a test asks for others."""
    return OperatorProcess(
        kubeconfig_path,
        nats_url,
        workdir,
        workers=FAKE_WORKERS,
        peering=PEERING,
        defaults=SETTINGS,
        signing_secret=signing_secret,
    )


def restricted_namespace(kubectl: Kubectl, mode: str) -> Iterator[str]:
    """A namespace enforcing Pod Security `restricted`, whose pods the agent runs by `mode`."""
    name = f"op-{uuid.uuid4().hex[:6]}"
    kubectl.apply(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "agent.polyrl.dev/mode": mode,
                    },
                },
            }
        )
    )
    wait_until(
        f"the default ServiceAccount in {name}",
        lambda: kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    kubectl("delete", "rlj,pg", "--all", "-n", name, "--wait=false", check=False)
    kubectl("delete", "namespace", name, "--wait=false", check=False)


class PodLogs:
    """What a namespace's pods wrote, for a failing test to show.

    In exec mode the node agent writes each container's output to
    `<cluster>/agent/pods/<namespace>_<pod>_<uid>/<container>.log`; when the pod is deleted
    it removes that sandbox and keeps the logs under `<cluster>/agent/deleted-pod-logs/`.
    `collect()` copies both here, so a pod that was replaced or deleted right after its
    last line still has its whole log in `report()`.
    """

    def __init__(self, cluster: Cluster, namespace: str, dest: Path) -> None:
        self.root = cluster.workdir / "agent" / "pods"
        self.cluster = cluster
        self.namespace = namespace
        self.dest = dest
        dest.mkdir(parents=True, exist_ok=True)

    @property
    def sandbox_prefix(self) -> str:
        """Every process of this namespace's pods has `POLYRL_POD_SANDBOX` starting so."""
        return f"{self.root}/{self.namespace}_"

    def collect(self) -> None:
        found: list[Path] = []
        for root in (self.root, deleted_pod_logs(self.root.parent)):
            # A sandbox removed while the glob walked it: its logs are kept, the next call
            # finds them there.
            with contextlib.suppress(OSError):
                found.extend(root.glob(f"{self.namespace}_*/*.log"))
        for log in found:
            pod, _, uid = log.parent.name.removeprefix(f"{self.namespace}_").rpartition("_")
            with contextlib.suppress(OSError):  # the agent may be removing it right now
                shutil.copyfile(log, self.dest / f"{pod}-{uid[:8]}-{log.name}")

    def report(self, lines: int = 40) -> str:
        self.collect()
        parts = []
        for log in sorted(self.dest.glob("*.log")):
            parts.append(f"--- pod log {log.name} (last {lines} lines) ---")
            parts.append(processes.tail(log, lines))
        agent_log = self.cluster.control_plane.logs / "node-agent.log"
        if agent_log.exists():
            mine = [
                line
                for line in agent_log.read_text(errors="replace").splitlines()
                if self.namespace in line
            ]
            parts.append(f"--- node agent, lines naming {self.namespace} (last {lines}) ---")
            parts.extend(mine[-lines:])
        return "\n".join(parts)


def pod_processes(logs: PodLogs) -> dict[int, str]:
    """Live processes started for the namespace's pods, PID -> command line, found by their
    environment: the node agent sets POLYRL_POD_SANDBOX, and children (torchrun's ranks,
    which run in sessions of their own) inherit it."""
    marker = f"POLYRL_POD_SANDBOX={logs.sandbox_prefix}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes():
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def wait_no_pod_processes(logs: PodLogs, timeout: float = 30.0) -> None:
    """Fail if the namespace's pod processes outlive `timeout`; then stop them, by PID."""
    with contextlib.suppress(AssertionError):  # asserted below, once what is left is stopped
        wait_until(
            f"the processes of the pods in {logs.namespace} to end",
            lambda: not pod_processes(logs),
            timeout=timeout,
            interval=0.5,
        )
    left = pod_processes(logs)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of deleted pods still running after {timeout:.0f}s: {left}"


def diagnosis(kubectl: Kubectl, operator: OperatorProcess, logs: PodLogs, lines: int = 60) -> str:
    """Objects, events, operator log, node agent and pod logs: what a red run needs."""
    ns = logs.namespace
    listing = kubectl("get", "rlj,pg,pods", "-n", ns, "-o", "wide", check=False)
    events = kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False)
    op_log = operator.log().splitlines() if operator.proc is not None else []
    op_log = [line for line in op_log if "aiohttp.access" not in line]  # liveness probes
    return "\n".join(
        [
            f"=== kubectl get rlj,pg,pods -n {ns} ===",
            listing.stdout + listing.stderr,
            f"=== events in {ns} (last {lines}) ===",
            *(events.stdout + events.stderr).splitlines()[-lines:],
            f"=== operator log, lines naming {ns} (last {lines}) ===",
            *[line for line in op_log if ns in line][-lines:],
            "=== operator log (last 20 lines) ===",
            *op_log[-20:],
            "=== pods ===",
            logs.report(),
        ]
    )


@contextlib.contextmanager
def explained(kubectl: Kubectl, operator: OperatorProcess, logs: PodLogs) -> Iterator[None]:
    """On a failed assertion, print the diagnosis (pytest shows it with the failure)."""
    try:
        yield
    except BaseException:
        print(diagnosis(kubectl, operator, logs))
        raise
