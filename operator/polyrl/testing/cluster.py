"""A whole test cluster: the control plane plus our node agent, started and stopped as one.

    python -m polyrl.testing.cluster up [--nodes 2] [--exec-namespace NS ...]  # prints KUBECONFIG
    python -m polyrl.testing.cluster down
    python -m polyrl.testing.cluster status

The node agent runs a pod's command as a local process only in namespaces labelled
`agent.polyrl.dev/mode=exec` (`up` creates and labels the namespaces given with
`--exec-namespace`: by default `polyrl-system`, where the chart installs the operator); in
every other namespace it only marks pods Running, unless `--mode exec` makes exec the
default for unlabelled namespaces. `up` leaves the processes running and writes their PIDs
to `state.json` in the cluster directory (default `~/.cache/polyrl/cluster`); `down` stops
exactly those PIDs, checking first that each still runs the binary we started, then removes
the data. The pytest session fixture uses the same class in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from polyrl.local import processes
from polyrl.local.errors import StartupError
from polyrl.testing import tools
from polyrl.testing.controlplane import ControlPlane
from polyrl.testing.kueue import MANAGED_LABEL, Kueue
from polyrl.testing.nodeagent import podnet
from polyrl.testing.nodeagent.agent import MODE_LABEL


class Cluster:
    def __init__(
        self,
        workdir: Path,
        *,
        tool_paths: tools.Tools,
        nodes: list[str] | None = None,
        mode: str = "status",
        exec_namespaces: tuple[str, ...] = (),
        apiserver_port: int = 0,
        ready_timeout: float = 90.0,
        agent_args: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        self.control_plane = ControlPlane(
            workdir, tools=tool_paths, apiserver_port=apiserver_port, ready_timeout=ready_timeout
        )
        self.node_specs = nodes or ["polyrl-node-0"]
        self.mode = mode
        self.exec_namespaces = exec_namespaces
        self.ready_timeout = ready_timeout
        self.agent_args = agent_args
        self.agent: processes.Managed | None = None
        self.kueue: Kueue | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def node_names(self) -> list[str]:
        return [spec.split(",", 1)[0] for spec in self.node_specs]

    @property
    def timings(self) -> dict[str, float]:
        return self.control_plane.timings.steps

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.control_plane.start()
        try:
            started = time.monotonic()
            self._start_agent()
            self._wait_usable()
            for namespace in self.exec_namespaces:
                label_exec(client.CoreV1Api(self.api()), namespace)
            self.timings["node agent + nodes Ready"] = time.monotonic() - started
        except BaseException:
            self.stop(remove=False)
            raise

    def start_kueue(self, *, wait_for_pods_ready: dict[str, Any] | None = None) -> Kueue:
        """Start Kueue on this cluster (`make tools` builds it; see polyrl.testing.kueue)."""
        kueue_dir = self.control_plane.tools.kueue
        if kueue_dir is None:
            raise StartupError("kueue: find build", "Kueue is not built: run `make tools`")
        self.kueue = Kueue(
            self.workdir / "kueue",
            kueue_dir=kueue_dir,
            kubectl=self.control_plane.tools.kubectl,
            kubeconfig=self.kubeconfig,
            ca=self.control_plane.pki.ca,
            wait_for_pods_ready=wait_for_pods_ready,
            ready_timeout=self.ready_timeout,
        )
        self.kueue.start()
        self.timings.update(self.kueue.timings)
        return self.kueue

    def stop(self, *, remove: bool = True) -> None:
        if self.kueue is not None:
            self.kueue.stop()
            self.kueue = None
        if self.agent is not None:
            processes.stop(self.agent)
            self.agent = None
        podnet.release_recorded(self.workdir / "agent" / podnet.RECORD)
        self.control_plane.stop(remove=remove)
        if remove:
            shutil.rmtree(self.workdir / "agent", ignore_errors=True)

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def _start_agent(self) -> None:
        argv: list[str | Path] = [
            sys.executable,
            "-m",
            "polyrl.testing.nodeagent",
            "--kubeconfig",
            self.kubeconfig,
            "--mode",
            self.mode,
            "--workdir",
            self.workdir / "agent",
            "--kube-version",
            tools.K8S_VERSION,
            *self.agent_args,
        ]
        for spec in self.node_specs:
            argv += ["--node", spec]
        self.agent = processes.start(
            "node-agent", argv, log=self.control_plane.logs / "node-agent.log"
        )

    def _wait_usable(self) -> None:
        """Nodes Ready and untainted, and the default ServiceAccount made (pods need it)."""
        assert self.agent is not None
        core = client.CoreV1Api(self.api())
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if not self.agent.alive():
                reason = f"node agent exited:\n{processes.tail(self.agent.log)}"
                raise StartupError("node agent: register nodes", reason, self.agent.log)
            if self._nodes_ready(core) and _has_default_sa(core):
                return
            time.sleep(0.2)
        raise StartupError(
            "node agent: wait for Ready nodes",
            f"nodes not Ready after {self.ready_timeout:.0f}s",
            self.agent.log,
        )

    def _nodes_ready(self, core: client.CoreV1Api) -> bool:
        ready = set()
        for node in core.list_node().items:
            conds = {c.type: c.status for c in (node.status.conditions or [])}
            if conds.get("Ready") == "True" and not (node.spec.taints or []):
                ready.add(node.metadata.name)
        return ready >= set(self.node_names)

    def state(self) -> dict[str, Any]:
        state = self.control_plane.state()
        if self.agent is not None:
            state["processes"].append(
                {
                    "name": self.agent.name,
                    "pid": self.agent.pid,
                    "argv0": self.agent.argv0,
                    "log": str(self.agent.log),
                }
            )
        if self.kueue is not None and self.kueue.proc is not None:
            proc = self.kueue.proc
            state["processes"].append(
                {"name": proc.name, "pid": proc.pid, "argv0": proc.argv0, "log": str(proc.log)}
            )
        state["nodes"] = self.node_names
        state["timings"] = self.timings
        return state


def label_exec(core: client.CoreV1Api, namespace: str) -> None:
    """Create `namespace` (or adopt it) with the label that makes the agent run its pods."""
    labels = {MODE_LABEL: "exec"}
    try:
        core.create_namespace({"metadata": {"name": namespace, "labels": labels}})
    except ApiException as err:
        if err.status != 409:
            raise
        core.patch_namespace(namespace, {"metadata": {"labels": labels}})


def _has_default_sa(core: client.CoreV1Api) -> bool:
    try:
        core.read_namespaced_service_account("default", "default")
    except ApiException:
        return False
    return True


def default_dir() -> Path:
    """Where `up` keeps a cluster: $POLYRL_CLUSTER_DIR, else `cluster/` in the cache."""
    explicit = os.environ.get("POLYRL_CLUSTER_DIR")
    return Path(explicit) if explicit else tools.cache_dir() / "cluster"


def stop_from_state(workdir: Path) -> list[str]:
    """Stop the processes a `cluster up` recorded; returns the names it stopped."""
    state_file = workdir / "state.json"
    if not state_file.exists():
        return []
    state = json.loads(state_file.read_text())
    stopped = []
    for entry in reversed(state["processes"]):
        proc = processes.Managed(entry["name"], entry["pid"], entry["argv0"], Path(entry["log"]))
        if proc.alive():
            processes.stop(proc)
            stopped.append(entry["name"])
    podnet.release_recorded(workdir / "agent" / podnet.RECORD)
    shutil.rmtree(workdir, ignore_errors=True)
    return stopped


def _up(args: argparse.Namespace) -> int:
    if (args.dir / "state.json").exists():
        print(f"a cluster is already up in {args.dir}; run `down` first", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    tool_paths = tools.ensure(with_kueue=args.kueue)
    built = time.monotonic() - t0
    nodes = [f"polyrl-node-{i}" for i in range(args.nodes)]
    cluster = Cluster(
        args.dir,
        tool_paths=tool_paths,
        nodes=nodes,
        mode=args.mode,
        exec_namespaces=tuple(args.exec_namespace or ["polyrl-system"]),
        apiserver_port=args.port,
    )
    cluster.start()
    if args.kueue:
        try:
            cluster.start_kueue()
        except BaseException:
            cluster.stop()
            raise
    (args.dir / "state.json").write_text(json.dumps(cluster.state(), indent=2))
    print(f"tools ready in {built:.1f}s; cluster {cluster.control_plane.timings.summary()}")
    print(f"nodes: {', '.join(nodes)}; pods run as processes in: {_exec_summary(cluster)}")
    if cluster.kueue is not None:
        print(
            f"kueue {tools.KUEUE_VERSION}: webhooks at {cluster.kueue.url}; it manages pods in "
            f"namespaces labelled {MANAGED_LABEL}=true"
        )
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _exec_summary(cluster: Cluster) -> str:
    names = ", ".join(cluster.exec_namespaces) or "no namespace"
    if cluster.mode == "exec":
        return f"every namespace not labelled {MODE_LABEL}=status"
    return f"{names} (label others {MODE_LABEL}=exec)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m polyrl.testing.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=default_dir())
    parser.add_argument("--nodes", type=int, default=1, help="how many nodes (default 1)")
    parser.add_argument(
        "--mode",
        choices=["status", "exec"],
        default="status",
        help="what the agent does in namespaces without the label "
        f"{MODE_LABEL}: status marks pods Running (default), exec runs them",
    )
    parser.add_argument(
        "--exec-namespace",
        action="append",
        metavar="NS",
        help="create NS labelled for exec mode (repeatable; default: polyrl-system)",
    )
    parser.add_argument("--port", type=int, default=0, help="API server port (0: a free one)")
    parser.add_argument(
        "--kueue",
        action="store_true",
        help=f"also start Kueue {tools.KUEUE_VERSION} (built by `make tools`), managing pods "
        f"in namespaces labelled {MANAGED_LABEL}=true",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return _up(args)
        if args.command == "down":
            stopped = stop_from_state(args.dir)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
            return 0
        state_file = args.dir / "state.json"
        if not state_file.exists():
            print("no cluster is up")
            return 1
        print(state_file.read_text())
        return 0
    except StartupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
