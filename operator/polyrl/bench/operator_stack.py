"""The benchmark's stack: a control plane, a nats-server and the operator, stopped by PID.

The operator is the tests' launcher (`polyrl.testing.operatorprocess`), standalone, with the
real workers (only the serving job's pods run them, on a nats-server of the benchmark's own)
and the operator's default status interval.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client

from polyrl.api import crds
from polyrl.bench.operator_common import NAMESPACE, STATUS_INTERVAL, say
from polyrl.bench.operator_pods import PodWatch
from polyrl.local import processes
from polyrl.local.natsserver import NatsServer
from polyrl.testing import tools
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import REAL_WORKERS, OperatorProcess
from polyrl.testing.waiting import wait_until


@dataclass
class Env:
    cluster: Cluster
    kubectl: Kubectl
    api: client.ApiClient
    nats: NatsServer
    operator: OperatorProcess
    metrics_url: str
    watch: PodWatch


def start_cluster(workdir: Path, stack: contextlib.ExitStack) -> tuple[Cluster, Kubectl]:
    paths = tools.ensure()
    cluster = Cluster(
        workdir / "k8s", tool_paths=paths, nodes=["polyrl-bench-0,capacity.pods=500"], mode="status"
    )
    cluster.start()
    stack.callback(stop_cluster, cluster)
    return cluster, Kubectl(paths.kubectl, cluster.kubeconfig)


def stop_cluster(cluster: Cluster) -> None:
    """Stop the cluster's processes all at once, with a short grace (they are SIGKILLed after
    half a second: their data is thrown away), then let `Cluster.stop` tidy up. Saves the tens of seconds a one-by-one graceful
    stop of the API server and friends takes."""
    procs = [cluster.agent, *cluster.control_plane.procs]
    threads = [
        threading.Thread(target=_timed_stop, args=(proc,), daemon=True)
        for proc in procs
        if proc is not None
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cluster.stop()
    say("stopped the control plane")


def _timed_stop(proc: processes.Managed) -> None:
    started = time.monotonic()
    processes.stop(proc, grace=0.5)
    say(f"stopped {proc.name} in {time.monotonic() - started:.1f}s")


def install_crds(kubectl: Kubectl) -> None:
    """The CRDs generated from the API models (what `crds/` holds), so no checkout is needed."""
    manifest = yaml.safe_dump_all(list(crds.all_crds().values()), sort_keys=False)
    kubectl.apply(manifest, "--server-side", "--force-conflicts")
    for crd in ("rljobs.polyrl.dev", "policygroups.polyrl.dev"):
        kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")


def make_namespace(kubectl: Kubectl) -> None:
    kubectl.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n")
    wait_until(
        f"the default ServiceAccount in {NAMESPACE}",
        lambda: kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0,
    )


def start_operator(
    workdir: Path, kubeconfig: Path, nats_url: str, stack: contextlib.ExitStack
) -> OperatorProcess:
    """`python -m polyrl.operator --standalone` with metrics, not waited for (`wait_live`)."""
    operator = OperatorProcess(
        kubeconfig,
        nats_url,
        workdir,
        workers=REAL_WORKERS,
        defaults={"POLYRL_STATUS_INTERVAL": str(STATUS_INTERVAL)},
    )
    operator.start(wait=False)
    stack.callback(_stop_operator, operator)
    return operator


def _stop_operator(operator: OperatorProcess) -> None:
    started = time.monotonic()
    operator.stop(grace=0.5)
    say(f"stopped the operator in {time.monotonic() - started:.1f}s")


@contextlib.contextmanager
def environment(workdir: Path) -> Iterator[Env]:
    """Everything started, in order; everything stopped by PID on the way out."""
    with contextlib.ExitStack() as stack:
        say("starting nats-server and the control plane (status-mode node agent)")
        (workdir / "nats").mkdir()
        nats = stack.enter_context(NatsServer(workdir / "nats"))
        cluster, kubectl = start_cluster(workdir, stack)
        say(f"control plane {cluster.control_plane.timings.summary()}")
        install_crds(kubectl)
        operator = start_operator(workdir, cluster.kubeconfig, nats.url, stack)
        make_namespace(kubectl)  # while the operator starts
        api = cluster.api()
        stack.callback(api.close)
        operator.wait_live()
        watch = PodWatch(api)
        watch.start()
        stack.callback(watch.stop)
        stack.callback(say, "stopping")
        say(f"operator up (pid {operator.pid})")
        env = Env(cluster, kubectl, api, nats, operator, operator.metrics_url, watch)
        try:
            yield env
        except BaseException:
            if operator.proc is not None:
                tail = processes.tail(operator.proc.log, 30)
                print(f"operator log tail:\n{tail}", file=sys.stderr)
            raise
