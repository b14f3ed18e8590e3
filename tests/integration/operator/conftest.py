"""The operator under test: started as its own process with the chart's ServiceAccount token.

RBAC comes from the Helm chart itself (ServiceAccount, ClusterRole, binding, peering), so a
verb missing from the chart fails a test here. Worker pods run the FAKE worker
(`tests/fakes/fake_worker.py`) in namespaces whose pods the node agent executes; elsewhere
pods are only marked Running. Test namespaces enforce Pod Security `restricted`.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from polyrl.testing import charts, processes
from polyrl.testing.cluster import Cluster
from polyrl.testing.controlplane import kubeconfig
from polyrl.testing.kube import Kubectl, wait_for
from polyrl.testing.natsserver import NatsServer

REPO = Path(__file__).resolve().parents[3]
FAKE_WORKER = REPO / "tests" / "fakes" / "fake_worker.py"
OPERATOR_NS = "polyrl-system"


@pytest.fixture(scope="session")
def crds_installed(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    for crd in ("rljobs.polyrl.dev", "policygroups.polyrl.dev", "clusterkopfpeerings.kopf.dev"):
        kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")


@pytest.fixture(scope="session")
def operator_kubeconfig(
    kubectl: Kubectl,
    helm_binary: Path,
    cluster: Cluster,
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A kubeconfig holding a token of the chart's ServiceAccount, and nothing more."""
    kubectl.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {OPERATOR_NS}\n")
    rendered = charts.render(helm_binary, REPO / "charts" / "polyrl", namespace=OPERATOR_NS)
    keep = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in keep]
    assert {d["kind"] for d in docs} == keep
    kubectl.apply(yaml.safe_dump_all(docs), "-n", OPERATOR_NS)
    sa = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    token = kubectl("create", "token", sa, "-n", OPERATOR_NS, "--duration=4h").stdout.strip()
    pki = cluster.control_plane.pki
    doc = kubeconfig(
        cluster.control_plane.server,
        ca=pki.ca.cert,
        cert=pki.admin.cert,
        key=pki.admin.key,
        user="polyrl-operator",
    )
    doc["users"][0]["user"] = {"token": token}
    path = tmp_path_factory.mktemp("operator") / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


class OperatorProcess:
    """`python -m polyrl.operator`, tracked by PID, restartable."""

    def __init__(self, kubeconfig_path: Path, nats_url: str, workdir: Path) -> None:
        self.kubeconfig = kubeconfig_path
        self.nats_url = nats_url
        self.workdir = workdir
        self.proc: processes.Managed | None = None
        self.starts = 0

    def env(self) -> dict[str, str]:
        worker = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_WORKER))}"
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "POLYRL_NATS_URL": self.nats_url,
            "POLYRL_NAMESPACE": OPERATOR_NS,
            "POLYRL_WORKER_COMMAND": worker,
            "POLYRL_TRAINER_ENTRY": str(FAKE_WORKER),
            "POLYRL_STATUS_INTERVAL": "1",
            "POLYRL_CLEANUP_TIMEOUT": "4",
            "POLYRL_NATS_TIMEOUT": "2",
        }

    def start(self) -> None:
        port = processes.free_port()
        self.starts += 1
        self.proc = processes.start(
            "operator",
            [
                sys.executable,
                "-m",
                "polyrl.operator",
                "--peering",
                "polyrl",
                "--liveness",
                f"http://127.0.0.1:{port}/healthz",
            ],
            log=self.workdir / f"operator-{self.starts}.log",
            env=self.env(),
        )
        url = f"http://127.0.0.1:{port}/healthz"
        wait_for("the operator's liveness probe", lambda: _ok(url, self.proc), timeout=60)

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop(self.proc, grace=10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        assert self.proc is not None
        return self.proc.log.read_text(errors="replace")


def _ok(url: str, proc: processes.Managed | None) -> bool:
    if proc is None or not proc.alive():
        raise AssertionError(f"operator exited:\n{processes.tail(proc.log) if proc else ''}")
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="session")
def operator(
    operator_kubeconfig: Path,
    nats_server: NatsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(operator_kubeconfig, nats_server.url, tmp_path_factory.mktemp("op"))
    op.start()
    yield op
    op.stop()


def _namespace(kubectl: Kubectl, mode: str) -> Iterator[str]:
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
    wait_for(
        f"the default ServiceAccount in {name}",
        lambda: kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    kubectl("delete", "rlj,pg", "--all", "-n", name, "--wait=false", check=False)
    kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def ns(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    """A restricted namespace whose pods are only marked Running."""
    yield from _namespace(kubectl, "status")


@pytest.fixture
def exec_ns(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    """A restricted namespace whose pods run (the fake worker) as local processes."""
    yield from _namespace(kubectl, "exec")


def settle(seconds: float = 1.0) -> None:
    time.sleep(seconds)
