"""Session-wide real services: one nats-server with JetStream, one Kubernetes cluster, and
the operator (with the chart's RBAC) for the tests that drive it.

Each starts lazily, on the first test that asks for it, and stops by PID at the end of
the session. Start-up times are printed in the terminal summary. The operator lives here,
not beside its integration tests, because the end-to-end tests use it too and there must
be only one (see `tests/operator_stack.py`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests.operator_stack import OPERATOR_NS, PEERING, REPO, operator_process

from polyrl.api import natsjwt
from polyrl.local.natsserver import NatsServer
from polyrl.testing import charts, tools
from polyrl.testing.cluster import Cluster
from polyrl.testing.controlplane import kubeconfig
from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.kueue import MANAGED_LABEL, Kueue
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until

_TIMINGS: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _TIMINGS:
        terminalreporter.section("test services")
        for name, text in _TIMINGS.items():
            terminalreporter.write_line(f"{name}: {text}")


class _EndToEndOnOneWorker:
    """Scheduling for `make test TEST_WORKERS=2` (`--dist loadgroup`): end-to-end tests are one unit
    of work, so they run one after another on one worker, each a whole system on two cores as
    its timeouts assume, while the other worker takes the rest of the suite test by test.
    The group is by path: xdist's `xdist_group` marks do not reach its scheduler under
    pytest 9.2, whose node ids xdist can no longer suffix."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class EndToEndOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return "tests/e2e" if nodeid.startswith("tests/e2e/") else nodeid

        return EndToEndOnOneWorker(config, log)


class _WorkerServices:
    """Under pytest-xdist each worker starts the services its tests ask for; their start-up
    times travel back with the worker's output so the summary still shows them."""

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        output = getattr(session.config, "workeroutput", None)
        if output is not None:
            output["test_services"] = dict(_TIMINGS)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        worker = node.workerinput["workerid"]
        for name, text in node.workeroutput.get("test_services", {}).items():
            _TIMINGS[f"{name} ({worker})"] = text


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_WorkerServices(), "polyrl-worker-services")
        config.pluginmanager.register(_EndToEndOnOneWorker(), "polyrl-e2e-on-one-worker")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    _TIMINGS["nats-server"] = f"started in {server.startup_seconds:.2f}s at {server.url}"
    yield server
    server.stop()


@pytest.fixture(scope="session")
def k8s_tools() -> tools.Tools:
    started = time.monotonic()
    was_built = tools.is_built("kubernetes") and tools.is_built("etcd")
    found = tools.ensure()
    state = "cached" if was_built else f"built in {time.monotonic() - started:.0f}s"
    _TIMINGS["kubernetes tools"] = f"{tools.K8S_VERSION} + etcd {tools.ETCD_VERSION}, {state}"
    return found


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    """helm built from `helm.sh/helm/v3/cmd/helm` (built on first use if missing)."""
    found = tools.ensure(with_helm=True).helm
    assert found is not None
    return found


VLLM_IMAGE = "ghcr.io/polyrl/worker-vllm-cpu"  # examples/vllm-cpu.yaml's policy image
VLLM_ENV = REPO / ".venv-vllm"


def vllm_image_args() -> tuple[str, ...]:
    return ("--image-env", f"{VLLM_IMAGE}={VLLM_ENV}") if (VLLM_ENV / "bin").is_dir() else ()


@pytest.fixture(scope="session")
def cluster(k8s_tools: tools.Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two agent nodes in `status` mode; a namespace labelled exec runs pod commands."""
    test_cluster = Cluster(
        tmp_path_factory.mktemp("k8s"),
        tool_paths=k8s_tools,
        nodes=[
            "polyrl-node-0,topology.kubernetes.io/region=local",
            "polyrl-node-1,topology.kubernetes.io/region=remote",
        ],
        mode="status",
        # Short token lifetimes and quick volume re-syncs, so tests see them happen; pods of
        # the vLLM worker image run in the vLLM environment, where `make install-vllm` built it.
        agent_args=("--token-max-age", "4", "--volume-sync", "1", *vllm_image_args()),
    )
    test_cluster.start()
    _TIMINGS["control plane"] = test_cluster.control_plane.timings.summary()
    test_cluster.started_at = time.monotonic()  # type: ignore[attr-defined]
    yield test_cluster
    test_cluster.stop()


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> Kueue:
    """Kueue on the session's cluster, managing pods in namespaces labelled MANAGED_LABEL
    only (`kueue_namespace`); stopped with the cluster. Built by `make tools` if missing."""
    if cluster.control_plane.tools.kueue is None:
        started = time.monotonic()
        tools.build(("kueue",))
        _TIMINGS["kueue build"] = f"{time.monotonic() - started:.0f}s"
        cluster.control_plane.tools = tools.Tools.from_cache()
    started = time.monotonic()
    running = cluster.start_kueue()
    _TIMINGS["kueue"] = f"{tools.KUEUE_VERSION} started in {time.monotonic() - started:.1f}s"
    return running


@pytest.fixture
def kueue_namespace(kubectl: Kubectl, kueue: Kueue) -> Iterator[str]:
    """A fresh namespace whose pods Kueue manages and the node agent runs."""
    for name in _make_namespace(kubectl, "exec"):
        kubectl("label", "namespace", name, f"{MANAGED_LABEL}=true")
        yield name


@pytest.fixture(scope="session")
def kube_api(cluster: Cluster) -> client.ApiClient:
    return cluster.api()


@pytest.fixture(scope="session")
def kubectl(cluster: Cluster, k8s_tools: tools.Tools) -> Kubectl:
    return Kubectl(k8s_tools.kubectl, cluster.kubeconfig)


@pytest.fixture(scope="session")
def crds_installed(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))

    # Not `kubectl wait`: it fails instead of waiting while a new CRD has no status yet.
    def established(crd: str) -> bool:
        return condition(kubectl.json("get", "crd", crd), "Established") == "True"

    for crd in ("rljobs.polyrl.dev", "policygroups.polyrl.dev", "clusterkopfpeerings.kopf.dev"):
        wait_until(f"CRD {crd} Established", lambda crd=crd: established(crd))  # type: ignore[misc]


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
    for doc in docs:
        if doc["kind"] == "ClusterKopfPeering":
            doc["metadata"]["name"] = PEERING
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


# The account whose signing key the session's operator holds (a Secret in its namespace).
SESSION_TRUST = natsjwt.Trust.new()
SIGNING_SECRET = "polyrl-nats-signing"


def signing_secret(kubectl: Kubectl, trust: natsjwt.Trust) -> str:
    """The Secret the chart's `nats.signingSecret` names: an account key and a signing seed."""
    doc = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SIGNING_SECRET, "namespace": OPERATOR_NS},
        "stringData": {"account": trust.account.public, "seed": trust.signing.seed},
    }
    kubectl.apply(yaml.safe_dump(doc))
    return SIGNING_SECRET


@pytest.fixture(scope="session")
def operator(
    kubectl: Kubectl,
    operator_kubeconfig: Path,
    nats_server: NatsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The one operator of the session; its pods run the fake worker until a test asks for
    others (`operator.use(...)`). It signs every job's per-role NATS users with
    `SESSION_TRUST`'s account signing key; the session's nats-server is open, so they are
    wired and carried but not enforced here (enforcement: test_nats_access.py, polyrl run)."""
    op = operator_process(
        operator_kubeconfig,
        nats_server.url,
        tmp_path_factory.mktemp("op"),
        signing_secret=signing_secret(kubectl, SESSION_TRUST),
    )
    op.start()
    yield op
    op.stop()


def _make_namespace(kubectl: Kubectl, mode: str | None) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    labels = f"\n  labels:\n    agent.polyrl.dev/mode: {mode}" if mode else ""
    kubectl.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}{labels}\n")
    # The ServiceAccount admission plugin rejects pods until the SA controller made one.
    wait_until(
        f"the default ServiceAccount in {name}",
        lambda: kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace whose pods are only marked Running (nothing is executed)."""
    yield from _make_namespace(kubectl, None)


@pytest.fixture
def exec_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace whose pods' commands the node agent runs as local processes."""
    yield from _make_namespace(kubectl, "exec")


@pytest.fixture(scope="session")
def tiny_bpe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`tiny_bpe(arch)`: the directory of a tiny model of `arch` (llama, qwen2, qwen3) with a
    BPE tokenizer, built locally once per session (`polyrl.workers.tinybpe`)."""
    from polyrl.workers.models import tinybpe

    cache = tmp_path_factory.mktemp("tiny-bpe")
    return lambda arch: tinybpe.ensure(f"{tinybpe.SCHEME}{arch}/test", cache)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory, dequantized (once, cached) from the
    GGUF file `make smollm2` fetches; the suite fails, saying so, where it is not fetched."""
    from polyrl.workers.models import catalog, gguf

    file = catalog.target(catalog.lookup(SMOLLM2))
    if not file.exists():
        pytest.fail(f"{file} is missing: fetch it with `make smollm2` (polyrl models fetch)")
    return gguf.ensure_directory(file, catalog.cache_dir())


SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests run wherever CUDA is present and are skipped, with the reason, elsewhere."""
    if not any(item.get_closest_marker("gpu") for item in items) or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
