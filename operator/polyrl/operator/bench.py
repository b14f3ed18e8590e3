"""`polyrl bench operator`: how fast and how cheap the operator is, on the test control plane.

One run starts everything it needs in a temporary directory (etcd, kube-apiserver,
controller-manager, scheduler and our node agent in `status` mode, which marks pods Running
without running them; a nats-server; the operator as its own process with `--metrics-port`)
and stops it all by PID at the end. Then, in one namespace:

1. apply-to-pods: RLJobs (two policies each: 2 trainers + 2 rollouts + 1 workflow runner =
   5 pods) are created one at a time; the time from the create call returning until the
   job's last pod is seen by a watch.
2. scale-up / scale-down: the first job's `<job>-solver` PolicyGroup is scaled by +10 and
   -10 through the scale subresource (what `kubectl scale pg` patches), alternately; the
   time from the patch returning until the 10th new pod is seen, or the 10th removed pod
   is marked deleting (`drainTimeoutSeconds: 0`: no worker answers the drain request, so
   the timeout decides, at once).
3. API requests per reconcile: the operator's own counters
   (`polyrl_operator_api_requests_total` / `polyrl_operator_reconciles_total`) over 1-2.
4. idle: more jobs are created in bulk up to `idle_jobs`; once every job is Running and
   the operator has made no API request for one status interval (or a bounded settle
   time has passed: an operator that never goes quiet is what idle shows), the process's
   CPU (utime+stime from /proc over wall time, percent of one core), its RSS, and its API
   requests and reconcile passes are measured over a window.

Pod times come from one pod watch in this process (first sighting of each pod UID), so
they include the watch's delivery; latencies are measured against `time.monotonic()`.
Progress goes to stderr; the figures are returned as a dict (stdout is the CLI's JSON).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines
from prometheus_client.parser import text_string_to_metric_families

from polyrl.api import crds, naming
from polyrl.api.base import GROUP, VERSION
from polyrl.operator.settings import OperatorSettings
from polyrl.testing import processes, tools
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl, wait_for
from polyrl.testing.natsserver import NatsServer

NAMESPACE = "polyrl-bench"
POLICIES = ("solver", "verifier")
SCALE_STEP = 10
WATCH_SECONDS = 1  # each pod watch request is this short, so the watch stops promptly
STATUS_INTERVAL = OperatorSettings().status_interval  # the operator's default
API_REQUESTS = "polyrl_operator_api_requests_total"
RECONCILES = "polyrl_operator_reconciles_total"


@dataclass(frozen=True, slots=True)
class Config:
    quick: bool
    apply_jobs: int
    scale_repeats: int
    idle_jobs: int
    idle_window_s: float
    quiet_timeout_s: float
    status_interval_s: float = STATUS_INTERVAL


def config(*, quick: bool) -> Config:
    if quick:
        return Config(
            quick=True,
            apply_jobs=3,
            scale_repeats=5,
            idle_jobs=10,
            idle_window_s=10.0,
            quiet_timeout_s=6.0,
        )
    return Config(
        quick=False,
        apply_jobs=10,
        scale_repeats=20,
        idle_jobs=50,
        idle_window_s=30.0,
        quiet_timeout_s=15.0,
    )


# --- small figures ------------------------------------------------------------------------


def say(message: str) -> None:
    """A progress line on stderr (stdout carries the JSON)."""
    print(f"[bench operator {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (with 20 samples, p99 is the largest)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    """Resident memory of a process in MiB (VmRSS, or VmHWM for the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


@dataclass(frozen=True, slots=True)
class Counters:
    """The operator's counters at one moment: API requests by verb, reconciles by kind."""

    requests: dict[str, float]
    reconciles: dict[str, float]

    @property
    def total_requests(self) -> float:
        return sum(self.requests.values())

    @property
    def total_reconciles(self) -> float:
        return sum(self.reconciles.values())

    def minus(self, earlier: Counters) -> Counters:
        return Counters(
            {k: v - earlier.requests.get(k, 0.0) for k, v in self.requests.items()},
            {k: v - earlier.reconciles.get(k, 0.0) for k, v in self.reconciles.items()},
        )


def scrape(url: str) -> Counters:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    requests: dict[str, float] = {}
    reconciles: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == API_REQUESTS:
                requests[sample.labels["verb"]] = sample.value
            elif sample.name == RECONCILES:
                reconciles[sample.labels["kind"]] = sample.value
    return Counters(requests, reconciles)


def per_reconcile(delta: Counters) -> float:
    return delta.total_requests / delta.total_reconciles if delta.total_reconciles else 0.0


# --- jobs ---------------------------------------------------------------------------------


def job_doc(name: str) -> dict[str, Any]:
    """Two policies, each 1 trainer + 1 rollout; drains time out at once (no workers run)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "policies": [
                {
                    "name": policy,
                    "model": {"path": f"tiny-llama://{policy}"},
                    "rollout": {"replicas": 1, "drainTimeoutSeconds": 0},
                }
                for policy in POLICIES
            ],
            "workflow": {"name": "solver-verifier"},
        },
    }


def pods_per_job(doc: dict[str, Any]) -> int:
    policies = doc["spec"]["policies"]
    trainers: int = sum(p.get("trainer", {}).get("replicas", 1) for p in policies)
    rollouts: int = sum(p["rollout"]["replicas"] for p in policies)
    runners: int = doc["spec"]["workflow"].get("replicas", 1)
    return trainers + rollouts + runners


def job_name(index: int) -> str:
    return f"bench-{index:03d}"


def create_job(api: client.ApiClient, doc: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, "rljobs", doc
    )


def scale_group(api: client.ApiClient, name: str, replicas: int) -> None:
    """What `kubectl scale pg NAME --replicas=N` does: a merge patch of the scale subresource."""
    client.CustomObjectsApi(api).patch_namespaced_custom_object_scale(
        GROUP, VERSION, NAMESPACE, "policygroups", name, {"spec": {"replicas": replicas}}
    )


def job_phases(api: client.ApiClient) -> dict[str, str]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, "rljobs"
    )["items"]
    return {j["metadata"]["name"]: (j.get("status") or {}).get("phase", "") for j in items}


def wait_all_running(api: client.ApiClient, count: int, timeout: float) -> float:
    """Seconds until `count` jobs report phase Running."""
    started = time.monotonic()
    wait_for(
        f"{count} RLJobs Running",
        lambda: sum(p == "Running" for p in job_phases(api).values()) >= count or None,
        timeout=timeout,
        interval=0.5,
    )
    return time.monotonic() - started


# --- pod watch ----------------------------------------------------------------------------


@dataclass(slots=True)
class SeenPod:
    name: str
    labels: dict[str, str]
    added: float
    running: float | None = None
    leaving: float | None = None  # deletionTimestamp seen, or the pod is gone


Predicate = Callable[[dict[str, SeenPod]], float | None]


@dataclass
class PodWatch:
    """Every pod of the namespace by UID, with when this process first saw it exist, run
    and leave. A daemon thread follows one watch; `wait` blocks on a predicate over it."""

    api: client.ApiClient
    pods: dict[str, SeenPod] = field(default_factory=dict)
    error: BaseException | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        core = client.CoreV1Api(self.api)
        listed = core.list_namespaced_pod(NAMESPACE, _preload_content=False)
        doc = json.loads(listed.data)
        for item in doc["items"]:
            self._record("ADDED", item)
        version = doc["metadata"]["resourceVersion"]
        self._thread = threading.Thread(
            target=self._follow, args=(version,), name="pod-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ends within one short watch (WATCH_SECONDS): a response cannot be closed safely
        from another thread while it is being read."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=WATCH_SECONDS + 5)

    def _follow(self, version: str) -> None:
        core = client.CoreV1Api(self.api)
        try:
            while not self._stopped.is_set():
                version = self._follow_once(core, version)
        except BaseException as err:  # surfaced by wait()
            self.error = err
            with self._cond:
                self._cond.notify_all()

    def _follow_once(self, core: client.CoreV1Api, version: str) -> str:
        """One watch request from `version`; returns the last version seen."""
        resp = core.list_namespaced_pod(
            NAMESPACE,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
        )
        try:
            for line in iter_resp_lines(resp):
                if not line:
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    raise RuntimeError(f"pod watch failed: {event['object']}")
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    self._record(event["type"], event["object"])
        finally:
            resp.close()
            resp.release_conn()
        return version

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        meta, status = obj["metadata"], obj.get("status") or {}
        with self._cond:
            seen = self.pods.get(meta["uid"])
            if seen is None:
                seen = self.pods[meta["uid"]] = SeenPod(meta["name"], meta.get("labels") or {}, now)
            if seen.running is None and status.get("phase") == "Running":
                seen.running = now
            if seen.leaving is None and (kind == "DELETED" or meta.get("deletionTimestamp")):
                seen.leaving = now
            self._cond.notify_all()

    def snapshot(self) -> dict[str, SeenPod]:
        with self._cond:
            return dict(self.pods)

    def wait(self, what: str, predicate: Predicate, timeout: float) -> float:
        """Block until `predicate(pods)` returns a time, and return it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.error is not None:
                    raise RuntimeError(f"pod watch stopped: {self.error!r}")
                found = predicate(self.pods)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
                self._cond.wait(min(left, 1.0))


def nth_time(times: list[float], n: int) -> float | None:
    """When the n-th of these events happened, or None before that."""
    if n <= 0:
        return time.monotonic()
    return sorted(times)[n - 1] if len(times) >= n else None


def pods_of_job(job: str, count: int) -> Predicate:
    return lambda pods: nth_time(
        [p.added for p in pods.values() if p.labels.get(naming.L_JOB) == job], count
    )


def rollouts_of(group: str, pods: dict[str, SeenPod]) -> dict[str, SeenPod]:
    return {
        uid: p
        for uid, p in pods.items()
        if p.labels.get(naming.L_GROUP) == group and p.labels.get(naming.L_ROLE) == "rollout"
    }


def new_rollouts(group: str, before: set[str], count: int) -> Predicate:
    return lambda pods: nth_time(
        [p.added for uid, p in rollouts_of(group, pods).items() if uid not in before], count
    )


def all_running(uids: set[str]) -> Predicate:
    return lambda pods: nth_time(
        [p.running for uid, p in pods.items() if uid in uids and p.running is not None],
        len(uids),
    )


def leaving_rollouts(group: str, before: set[str], count: int) -> Predicate:
    return lambda pods: nth_time(
        [p.leaving for uid, p in rollouts_of(group, pods).items() if uid in before and p.leaving],
        count,
    )


def active_rollouts(group: str, watch: PodWatch) -> set[str]:
    return {uid for uid, p in rollouts_of(group, watch.snapshot()).items() if p.leaving is None}


# --- the environment ----------------------------------------------------------------------


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
        say(f"control plane up: {cluster.control_plane.timings.summary()}")
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


def measure_apply(env: Env, count: int) -> list[float]:
    """Create jobs one at a time; seconds from each create until its last pod exists."""
    times = []
    for i in range(count):
        doc = job_doc(job_name(i))
        create_job(env.api, doc)
        t0 = time.monotonic()
        seen = env.watch.wait(
            f"the pods of {job_name(i)}", pods_of_job(job_name(i), pods_per_job(doc)), 60
        )
        times.append(seen - t0)
        say(f"apply {job_name(i)}: {pods_per_job(doc)} pods in {seen - t0:.3f}s")
    return times


def scale_up_once(env: Env, group: str, replicas: int) -> float:
    """Scale `group` up by SCALE_STEP; seconds until the last new pod exists. Returns once
    they all run, so the next scale-down starts from a steady group."""
    before = set(rollouts_of(group, env.watch.snapshot()))
    scale_group(env.api, group, replicas)
    t0 = time.monotonic()
    seen = env.watch.wait(
        f"{SCALE_STEP} new pods of {group}", new_rollouts(group, before, SCALE_STEP), 60
    )
    new = set(rollouts_of(group, env.watch.snapshot())) - before
    env.watch.wait(f"the new pods of {group} Running", all_running(new), 60)
    return seen - t0


def scale_down_once(env: Env, group: str, replicas: int) -> float:
    """Scale `group` down by SCALE_STEP; seconds until the last victim is marked deleting."""
    before = active_rollouts(group, env.watch)
    scale_group(env.api, group, replicas)
    t0 = time.monotonic()
    seen = env.watch.wait(
        f"{SCALE_STEP} pods of {group} leaving", leaving_rollouts(group, before, SCALE_STEP), 60
    )
    return seen - t0


def baseline_pod(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"baseline-{index}", "labels": {"polyrl.dev/bench": "baseline"}},
        "spec": {"containers": [{"name": "c", "image": "baseline", "command": ["true"]}]},
    }


def measure_baseline(env: Env, count: int = SCALE_STEP) -> float:
    """Seconds for this process to create `count` plain pods one after another: what the
    API server alone costs for a scale-up made of sequential creates (the same floor the
    operator's pod creates stand on)."""
    core = client.CoreV1Api(env.api)
    t0 = time.monotonic()
    for i in range(count):
        core.create_namespaced_pod(NAMESPACE, baseline_pod(i))
    elapsed = time.monotonic() - t0
    core.delete_collection_namespaced_pod(
        NAMESPACE, label_selector="polyrl.dev/bench=baseline", grace_period_seconds=0
    )
    say(f"baseline: {count} sequential pod creates from this process in {elapsed:.3f}s")
    return elapsed


def measure_scale(env: Env, repeats: int) -> tuple[list[float], list[float]]:
    group = naming.policy_group(job_name(0), POLICIES[0])
    base = len(active_rollouts(group, env.watch))
    ups, downs = [], []
    for i in range(repeats):
        ups.append(scale_up_once(env, group, base + SCALE_STEP))
        downs.append(scale_down_once(env, group, base))
        say(
            f"scale {i + 1}/{repeats}: +{SCALE_STEP} in {ups[-1]:.3f}s, -{SCALE_STEP} in {downs[-1]:.3f}s"
        )
    return ups, downs


def create_bulk(env: Env, first: int, last: int) -> float:
    """Create jobs first..last-1 back to back; pods created per second until all exist."""
    if last <= first:
        return 0.0
    docs = [job_doc(job_name(i)) for i in range(first, last)]
    t0 = time.monotonic()
    for doc in docs:
        create_job(env.api, doc)
    total = sum(pods_per_job(d) for d in docs)
    names = {d["metadata"]["name"] for d in docs}
    seen = env.watch.wait(
        f"{total} pods of {len(docs)} new jobs",
        lambda pods: nth_time(
            [p.added for p in pods.values() if p.labels.get(naming.L_JOB) in names], total
        ),
        300,
    )
    say(f"bulk: {len(docs)} jobs, {total} pods in {seen - t0:.2f}s")
    return total / (seen - t0)


def wait_quiet(env: Env, quiet_s: float, timeout: float) -> float:
    """Seconds until the operator made no API request for `quiet_s` (or `timeout` passed)."""
    started = time.monotonic()
    last = scrape(env.metrics_url).total_requests
    last_change = time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(0.5)
        now = scrape(env.metrics_url).total_requests
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change >= quiet_s:
            break
    return time.monotonic() - started


def measure_idle(env: Env, window: float) -> dict[str, Any]:
    pid = env.operator.pid
    before, cpu0, t0 = scrape(env.metrics_url), cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    after, cpu1, t1 = scrape(env.metrics_url), cpu_seconds(pid), time.monotonic()
    delta = after.minus(before)
    wall = t1 - t0
    return {
        "idle_window_s": round(wall, 2),
        "idle_cpu_percent": round(100 * (cpu1 - cpu0) / wall, 2),
        "idle_rss_mb": round(rss_mb(pid), 1),
        "peak_rss_mb": round(rss_mb(pid, "VmHWM"), 1),
        "idle_api_requests_per_s": round(delta.total_requests / wall, 3),
        "idle_api_requests_by_verb": {k: int(v) for k, v in delta.requests.items() if v},
        "idle_reconciles_per_s": round(delta.total_reconciles / wall, 2),
    }


def measure(env: Env, cfg: Config) -> dict[str, Any]:
    start = scrape(env.metrics_url)
    applies = measure_apply(env, cfg.apply_jobs)
    baseline = measure_baseline(env)
    ups, downs = measure_scale(env, cfg.scale_repeats)
    active = scrape(env.metrics_url).minus(start)
    say(f"creating {cfg.idle_jobs - cfg.apply_jobs} more jobs for the idle measurement")
    bulk_rate = create_bulk(env, cfg.apply_jobs, cfg.idle_jobs)
    running_s = wait_all_running(env.api, cfg.idle_jobs, 300)
    say(f"all {cfg.idle_jobs} jobs Running after {running_s:.1f}s; waiting for API quiet")
    quiet_s = wait_quiet(env, cfg.status_interval_s + 0.5, cfg.quiet_timeout_s)
    say(f"settled in {quiet_s:.1f}s; measuring idle for {cfg.idle_window_s:.0f}s")
    idle = measure_idle(env, cfg.idle_window_s)
    return {
        "quick": cfg.quick,
        "cpus": os.cpu_count(),
        "status_interval_s": cfg.status_interval_s,
        "apply_jobs": cfg.apply_jobs,
        "pods_per_job": pods_per_job(job_doc("x")),
        "apply_to_pods_median_s": round(statistics.median(applies), 4),
        "apply_to_pods_max_s": round(max(applies), 4),
        "scale_repeats": cfg.scale_repeats,
        "scale_step": SCALE_STEP,
        "scale_up_median_s": round(statistics.median(ups), 4),
        "scale_up_p99_s": round(percentile(ups, 99), 4),
        "baseline_create_10_pods_s": round(baseline, 4),
        "scale_up_over_baseline": round(statistics.median(ups) / baseline, 2),
        "scale_down_median_s": round(statistics.median(downs), 4),
        "scale_down_p99_s": round(percentile(downs, 99), 4),
        "api_requests_per_reconcile": round(per_reconcile(active), 3),
        "active_api_requests_by_verb": {k: int(v) for k, v in active.requests.items() if v},
        "active_reconciles": int(active.total_reconciles),
        "bulk_pods_per_s": round(bulk_rate, 2),
        "idle_jobs": cfg.idle_jobs,
        "idle_pods": cfg.idle_jobs * pods_per_job(job_doc("x")),
        "idle_settle_s": round(quiet_s, 1),
        **idle,
    }


def run(*, quick: bool) -> dict[str, Any]:
    cfg = config(quick=quick)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-") as tmp, environment(Path(tmp)) as env:
        figures = measure(env, cfg)
    figures["total_s"] = round(time.monotonic() - started, 1)
    say(f"done in {figures['total_s']:.0f}s")
    return figures
