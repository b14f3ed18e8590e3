"""The benchmark's stack: a control plane, a nats-server and the operator, stopped by PID."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import urllib.request
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
from polyrl.testing.kube import Kubectl, wait_for


@dataclass
class Env:
    cluster: Cluster
    kubectl: Kubectl
    api: client.ApiClient
    nats: NatsServer
    operator: processes.Managed
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
    wait_for(
        f"the default ServiceAccount in {NAMESPACE}",
        lambda: kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0,
    )


def start_operator(
    workdir: Path, kubeconfig: Path, nats_url: str, stack: contextlib.ExitStack
) -> tuple[processes.Managed, str, str]:
    """`python -m polyrl.operator --standalone` with metrics, not waited for; returns it,
    its metrics URL and its liveness URL."""
    metrics_port, live_port = processes.free_port(), processes.free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "POLYRL_NATS_URL": nats_url,
        "POLYRL_STATUS_INTERVAL": str(STATUS_INTERVAL),
        # Only the serving job's pods run workers, on a server of the benchmark's own.
        "POLYRL_NATS_INSECURE": "true",
        # Real workers (the serving part), one torch thread each as in `polyrl run`.
        "POLYRL_WORKER_COMMAND": "env OMP_NUM_THREADS=1 POLYRL_TORCH_THREADS=1 polyrl worker",
    }
    proc = processes.start(
        "operator",
        [
            sys.executable,
            "-m",
            "polyrl.operator",
            "--standalone",
            "--metrics-port",
            str(metrics_port),
            "--liveness",
            f"http://127.0.0.1:{live_port}/healthz",
        ],
        log=workdir / "operator.log",
        env=env,
    )
    stack.callback(_timed_stop, proc)
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    return proc, metrics, f"http://127.0.0.1:{live_port}/healthz"


def wait_operator(proc: processes.Managed, liveness_url: str) -> None:
    wait_for("the operator's liveness probe", lambda: _answers(liveness_url, proc), timeout=60)


def _answers(url: str, proc: processes.Managed) -> bool:
    if not proc.alive():
        raise RuntimeError(f"the operator exited:\n{processes.tail(proc.log)}")
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


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
        operator, metrics_url, live_url = start_operator(
            workdir, cluster.kubeconfig, nats.url, stack
        )
        make_namespace(kubectl)  # while the operator starts
        api = cluster.api()
        stack.callback(api.close)
        wait_operator(operator, live_url)
        watch = PodWatch(api)
        watch.start()
        stack.callback(watch.stop)
        stack.callback(say, "stopping")
        say(f"operator up (pid {operator.pid})")
        env = Env(cluster, kubectl, api, nats, operator, metrics_url, watch)
        try:
            yield env
        except BaseException:
            print(f"operator log tail:\n{processes.tail(operator.log, 30)}", file=sys.stderr)
            raise


# --- the measurements ---------------------------------------------------------------------
