"""The docs' cluster commands, run as written, on a test cluster of their own.

The README's "On a cluster" section, the example headers, the chart's README and the notes
Helm prints run here command by command, read from the docs (`tests/documented.py`), with
kubectl and helm on PATH. The chart's operator runs as the Deployment's pod, under its own
ServiceAccount, through in-cluster config; the session's test operator is not used (two
operators would pause each other), so this module starts a cluster of its own. What the test
cluster cannot provide is substituted, and only this:

- the NATS URL: `nats.nats.svc` does not resolve here (no cluster DNS), so a nats-server
  started here (`nats://127.0.0.1:<port>`) replaces it, in the `--set` and in a copy of the
  kustomization: one that trusts the account the documented `polyrl nats-trust` made (as the
  docs tell a NATS server to), so the path runs with signed per-role users, enforced;
- the working directory: a scratch directory with the repository's `crds/`, `charts/`,
  `examples/` and `manifests/` linked in, so `polyrl nats-trust nats-trust` writes there;
- `polyrl-system` exists before `helm install` (which then adopts it: `--create-namespace`
  stays) with the label that makes the node agent run its pods; every other namespace's pods
  are only marked Running, so the examples' workers do not run (the operator e2e test runs
  them);
- `kubectl get pg -w` never ends by itself: it runs for a few seconds.

The README's commands for a hand-started test cluster (`make cluster-up` ...) run in a
second test, with the cluster kept under a temporary `POLYRL_CLUSTER_DIR` instead of the
cache.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests import documented

from polyrl.api import natsjwt
from polyrl.local.natsserver import NatsServer
from polyrl.testing import tools
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = documented.REPO
DOC_NATS = "nats://nats.nats.svc:4222"
WATCH_SECONDS = 4


@pytest.fixture(scope="module")
def docs_cluster(
    k8s_tools: tools.Tools, helm_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    started = time.monotonic()
    cluster = Cluster(
        tmp_path_factory.mktemp("docs-k8s"),
        tool_paths=k8s_tools,
        nodes=["polyrl-node-0", "polyrl-node-1"],
        exec_namespaces=("polyrl-system",),
    )
    with cluster:
        print(f"docs cluster up in {time.monotonic() - started:.1f}s")
        yield cluster


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the documented commands run: the repository's parts they name, linked in."""
    work = tmp_path / "work"
    work.mkdir()
    for part in ("crds", "charts", "examples", "manifests"):
        (work / part).symlink_to(REPO / part)
    return work


@pytest.fixture
def shell(
    docs_cluster: Cluster,
    k8s_tools: tools.Tools,
    helm_binary: Path,
    tmp_path: Path,
    workdir: Path,
) -> Any:
    """Runs one documented command with bash in `cwd` (`workdir` by default), with kubectl,
    helm and this environment's `polyrl` on PATH."""
    env = {
        **os.environ,
        "KUBECONFIG": str(docs_cluster.kubeconfig),
        "PATH": os.pathsep.join(
            [
                str(k8s_tools.kubectl.parent),
                str(helm_binary.parent),
                str(Path(sys.executable).parent),
                os.environ["PATH"],
            ]
        ),
        "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
        "HELM_DATA_HOME": str(tmp_path / "helm-data"),
    }

    def run(command: str, *, cwd: Path = workdir, timeout: float = 120) -> str:
        watch = command.endswith(" -w")
        argv = (
            ["timeout", str(WATCH_SECONDS), "bash", "-c", command]
            if watch
            else ["bash", "-c", command]
        )
        proc = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        ok = proc.returncode == (124 if watch else 0)  # a watch is stopped by `timeout`
        assert ok, f"`{command}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        print(f"$ {command}\n{proc.stdout.rstrip()}")
        return proc.stdout

    return run


@pytest.fixture
def kubectl(docs_cluster: Cluster, k8s_tools: tools.Tools) -> Kubectl:
    return Kubectl(k8s_tools.kubectl, docs_cluster.kubeconfig)


def operator_pod(kubectl: Kubectl) -> dict[str, Any]:
    """The chart's operator pod once it is Ready (running as a process on the node agent)."""

    def ready() -> dict[str, Any] | None:
        pods = kubectl.json(
            "get", "pods", "-n", "polyrl-system", "-l", "app.kubernetes.io/component=operator"
        )
        for pod in pods["items"]:
            if pod["status"].get("phase") == "Running" and condition(pod, "Ready") == "True":
                return dict(pod)
        return None

    return wait_until("the chart's operator pod Ready", ready, timeout=90)


def wait_operator_gone(kubectl: Kubectl) -> None:
    wait_until(
        "the operator pod gone",
        lambda: not kubectl.json("get", "pods", "-n", "polyrl-system")["items"],
        timeout=90,
    )


def job_pods(kubectl: Kubectl, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json("get", "pods", "-l", f"polyrl.dev/job={job}")[
        "items"
    ]
    return items


def rollouts(kubectl: Kubectl, job: str, policy: str) -> int:
    return sum(
        1
        for p in job_pods(kubectl, job)
        if p["metadata"]["labels"].get("polyrl.dev/role") == "rollout"
        and p["metadata"]["labels"].get("polyrl.dev/policy") == policy
        and not p["metadata"].get("deletionTimestamp")
    )


def wait_scaled(kubectl: Kubectl, job: str, replicas: int) -> None:
    wait_until(
        f"{replicas} solver rollouts of {job}",
        lambda: rollouts(kubectl, job, "solver") == replicas,
        timeout=60,
    )


def check_operator_in_its_pod(kubectl: Kubectl) -> None:
    pod = operator_pod(kubectl)
    assert pod["spec"]["serviceAccountName"] == "polyrl-operator"
    assert not pod["status"]["podIP"].startswith("127.")
    name = pod["metadata"]["name"]
    # The chart's liveness probe starts after 10 s: once it has answered, the operator is
    # serving at its pod's address, and its log shows how it logged in.

    def probed() -> str | None:
        out: str = kubectl("logs", "-n", "polyrl-system", name).stdout
        return out if "kube-probe" in out else None

    log = wait_until("the node agent's liveness probe answered by the operator", probed, timeout=60)
    assert "Invalid kube-config" not in log


@pytest.fixture
def trusted_nats(workdir: Path, tmp_path: Path) -> Iterator[Any]:
    """`start()`: a nats-server trusting the account `polyrl nats-trust nats-trust` wrote
    into `workdir` (what the docs tell a NATS server to include), once that ran."""
    servers: list[NatsServer] = []

    def start() -> NatsServer:
        server = NatsServer(tmp_path / "nats", trust=natsjwt.Trust.load(workdir / "nats-trust"))
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def check_signed_users(kubectl: Kubectl, job: str, server: NatsServer) -> None:
    """The job runs with per-role users of its own, on a server that refuses anyone else."""

    def isolated() -> bool:
        conditions = kubectl.json("get", "rlj", job).get("status", {}).get("conditions") or []
        said = {c["type"]: c["status"] for c in conditions}
        return said.get("NatsIsolated") == "True" and said.get("NatsReady") == "True"

    wait_until(f"{job}: NatsIsolated and NatsReady", isolated, timeout=60)
    users = kubectl.json("get", "secret", f"{job}-nats-users")
    assert {"workflow.creds", "trainer-solver.creds", "rollout-verifier.creds"} <= set(
        users["data"]
    )
    assert asyncio.run(anonymous_refused(server.port))


async def anonymous_refused(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reader.readline()  # INFO
    writer.write(b'CONNECT {"verbose":false}\r\nPING\r\n')
    answer = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    await writer.wait_closed()
    return b"Authorization Violation" in answer


def test_the_readme_cluster_path_runs_as_written_with_the_charts_operator_pod(
    shell: Any, kubectl: Kubectl, trusted_nats: Any, helm_binary: Path
) -> None:
    commands = documented.block("README.md", "On a cluster")
    assert any(DOC_NATS in c for c in commands), "the README no longer names the NATS URL"
    server: NatsServer | None = None
    for command in commands:
        url = server.url if server is not None else DOC_NATS
        out = shell(command.replace(DOC_NATS, url))
        if command.startswith("polyrl nats-trust"):
            server = trusted_nats()
        elif command.startswith("helm install"):
            check_operator_in_its_pod(kubectl)
            check_documented_upgrades_keep_the_nats_url(shell, url)
        elif command == "kubectl apply -f examples/solver-verifier.yaml":
            wait_until(
                "the job Running",
                lambda: _phase(kubectl, "solver-verifier") == "Running",
                timeout=60,
            )
            assert server is not None
            check_signed_users(kubectl, "solver-verifier", server)
        elif command.startswith("kubectl get rlj,pg"):
            assert "solver-verifier-solver" in out
            assert "solver-verifier-verifier" in out
        elif command.startswith("kubectl get pg -w"):
            assert "solver-verifier-solver" in out
        elif command.startswith("kubectl scale pg solver-verifier-solver"):
            wait_scaled(kubectl, "solver-verifier", int(command.rsplit("=", 1)[1]))
        elif command.startswith("kubectl delete rlj solver-verifier"):
            wait_until(
                "the job's pods gone", lambda: not job_pods(kubectl, "solver-verifier"), timeout=90
            )
            wait_until(  # owned by the job: the garbage collector removes them
                "the job's groups gone", lambda: not kubectl.json("get", "pg")["items"], timeout=60
            )

    # The example's own header, then the notes `helm install` printed (rendered).
    for command in [
        c.text for c in documented.commands() if c.source == "examples/solver-verifier.yaml"
    ]:
        out = shell(command)
        if command.startswith("kubectl apply"):  # a user reads `get` before scaling
            wait_until("the job Running", lambda: _phase(kubectl, "solver-verifier") == "Running")
        elif command.startswith("kubectl scale"):
            wait_scaled(kubectl, "solver-verifier", int(command.rsplit("=", 1)[1]))
    shell("kubectl delete rlj solver-verifier")
    wait_until("the job's pods gone", lambda: not job_pods(kubectl, "solver-verifier"), timeout=90)
    notes = shell("helm get notes polyrl -n polyrl-system")
    assert "Each job's pods get NATS users of their own" in notes
    noted = [
        line.strip()
        for line in notes.splitlines()
        if line.startswith("  ") and line.split()[0] in documented.COMMAND_WORDS
    ]
    assert len(noted) == len([c for c in documented.commands() if c.source == documented.NOTES])
    for command in noted:
        out = shell(command)
        if command.startswith("kubectl apply"):
            wait_until("the job Running", lambda: _phase(kubectl, "solver-verifier") == "Running")
        elif command.startswith("kubectl describe rlj solver-verifier"):
            assert "NatsIsolated" in out
        elif command.startswith("kubectl scale pg solver-verifier-solver"):
            wait_scaled(kubectl, "solver-verifier", int(command.rsplit("=", 1)[1]))
        elif command.startswith("kubectl logs"):
            assert "kube-probe" in out
    shell("kubectl delete rlj solver-verifier")
    wait_until("the job's pods gone", lambda: not job_pods(kubectl, "solver-verifier"), timeout=90)


def documented_upgrades() -> list[str]:
    """Every `helm upgrade` command the docs give, in a code block or inline."""
    found = []
    for path in [REPO / "README.md", REPO / "charts/polyrl/README.md", *REPO.glob("docs/*.md")]:
        for match in re.finditer(r"helm upgrade[^`\n]*", path.read_text()):
            command = match.group(0).split("  #")[0].strip()
            if len(command.split()) > 3:  # a command, not the name in prose
                found.append(command)
    return found


def check_documented_upgrades_keep_the_nats_url(shell: Any, installed: str) -> None:
    """Each documented `helm upgrade`, run with --dry-run against the release the README
    installed, keeps its NATS URL (Helm resets values an upgrade does not repeat)."""
    upgrades = documented_upgrades()
    assert upgrades, "the docs give no helm upgrade"
    for command in upgrades:
        args = command.replace("--set ...", "").split()
        rendered = shell(" ".join([*args, "--dry-run"]))
        manifest = rendered.split("MANIFEST:", 1)[1].split("\nNOTES:", 1)[0]
        manifests = [d for d in yaml.safe_load_all(manifest) if d]
        deployment = next(d for d in manifests if d["kind"] == "Deployment")
        env = {
            e["name"]: e.get("value")
            for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["POLYRL_NATS_URL"] == installed, f"`{command}` moves the operator's NATS"


def _phase(kubectl: Kubectl, job: str) -> str:
    phase: str = kubectl.json("get", "rlj", job).get("status", {}).get("phase", "")
    return phase


def test_the_charts_readme_installs_with_helm_and_with_the_kustomization(
    shell: Any, kubectl: Kubectl, trusted_nats: Any, tmp_path: Path, workdir: Path
) -> None:
    if "polyrl" in shell("helm list -n polyrl-system -q").split():
        shell("helm uninstall polyrl -n polyrl-system")
    wait_operator_gone(kubectl)
    server: NatsServer | None = None
    for command in documented.block("charts/polyrl/README.md", "Install"):
        url = server.url if server is not None else DOC_NATS
        out = shell(command.replace(DOC_NATS, url))
        if command.startswith("polyrl nats-trust"):
            server = trusted_nats()
        elif command.startswith("helm install"):
            operator_pod(kubectl)
        elif command.startswith("kubectl get rlj,pg"):
            assert "solver-verifier" in out
    assert server is not None
    check_signed_users(kubectl, "solver-verifier", server)
    shell("kubectl delete rlj solver-verifier")
    wait_until("the job's pods gone", lambda: not job_pods(kubectl, "solver-verifier"), timeout=90)
    shell("helm uninstall polyrl -n polyrl-system")
    wait_operator_gone(kubectl)

    # Without Helm: the same commands in a copy of the repository's layout whose
    # kustomization names the test's NATS server.
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "manifests", checkout / "manifests")
    (checkout / "crds").symlink_to(REPO / "crds")
    (checkout / "nats-trust").symlink_to(workdir / "nats-trust")
    kustomization = checkout / "manifests" / "kustomization.yaml"
    assert DOC_NATS in kustomization.read_text()
    kustomization.write_text(kustomization.read_text().replace(DOC_NATS, server.url))
    for command in documented.block("charts/polyrl/README.md", "Without Helm"):
        shell(command, cwd=checkout)
    pod = operator_pod(kubectl)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["POLYRL_NATS_URL"] == server.url
    assert env["POLYRL_NATS_SIGNING_SECRET"] == "polyrl-nats-signing"
    check_operator_in_its_pod(kubectl)
    shell("kubectl delete -k manifests/", cwd=checkout)


def test_the_readmes_hand_started_cluster_commands_run_as_written(tmp_path: Path) -> None:
    """In a scratch directory (`make` pointed at the repository with -C), so the trust and
    the NATS log land there; after the backgrounded NATS helper, the test waits for its log
    to name its URL before the next documented command (`kill %1`) stops it."""
    commands = documented.block("README.md", "Starting and stopping a control plane by hand")
    cluster_dir = tmp_path / "cluster"
    default = "~/.cache/polyrl/cluster"
    assert any(default in c for c in commands)
    lines = ["set -euo pipefail"]
    for command in commands:
        command = command.replace(default, str(cluster_dir))
        lines.append(f"make -C {REPO} {command[5:]}" if command.startswith("make ") else command)
        if command.startswith("python -m polyrl.local.natsserver"):
            lines.append(WAIT_FOR_NATS_LOG)
    scratch = tmp_path / "work"
    scratch.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    proc = subprocess.run(
        ["bash", "-c", "\n".join(lines)],
        cwd=scratch,
        env={
            **os.environ,
            "POLYRL_CLUSTER_DIR": str(cluster_dir),
            "PATH": os.pathsep.join([venv_bin, os.environ["PATH"]]),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"export KUBECONFIG={cluster_dir / 'admin.kubeconfig'}" in proc.stdout
        assert "polyrl-node-0   Ready" in proc.stdout  # kubectl get nodes
        assert (scratch / "nats-trust" / "trust.json").is_file()  # polyrl nats-trust
        assert "only users of the trust in nats-trust" in proc.stdout  # the NATS helper's log
        assert "stopped: node-agent" in proc.stdout  # make cluster-down
        assert not cluster_dir.exists()
    finally:
        subprocess.run(
            ["make", "cluster-down"],
            cwd=REPO,
            env={**os.environ, "POLYRL_CLUSTER_DIR": str(cluster_dir)},
            check=False,
            capture_output=True,
        )


WAIT_FOR_NATS_LOG = (
    "for _ in $(seq 300); do grep -q nats:// nats.log && break; sleep 0.1; done; cat nats.log"
)


def test_the_documented_kustomization_sets_only_the_nats_url(k8s_tools: tools.Tools) -> None:
    rendered = subprocess.run(
        [str(k8s_tools.kubectl), "kustomize", str(REPO / "manifests")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    plain = [o for o in yaml.safe_load_all((REPO / "manifests" / "polyrl.yaml").read_text()) if o]
    plain += [
        o for o in yaml.safe_load_all((REPO / "manifests" / "namespace.yaml").read_text()) if o
    ]
    assert sorted(o["kind"] for o in objects) == sorted(o["kind"] for o in plain)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "POLYRL_NATS_URL"] == [
        {"name": "POLYRL_NATS_URL", "value": DOC_NATS}
    ]
