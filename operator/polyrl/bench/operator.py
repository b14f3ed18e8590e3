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
5. scale to serving (`operator_serving`): in a second namespace whose pods the node agent
   runs, a real job (tiny model) is scaled up by `serving_step` rollout pods once it
   serves; from the patch to every new pod Running, and to every new pod Ready (serving
   the current weights, by its readiness probe).

Pod times come from one pod watch in this process (first sighting of each pod UID), so
they include the watch's delivery; latencies are measured against `time.monotonic()`.
Progress goes to stderr; the figures are returned as a dict (stdout is the CLI's JSON).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from polyrl.api import naming
from polyrl.api.base import GROUP, VERSION
from polyrl.bench import operator_serving
from polyrl.bench.operator_common import (
    API_REQUESTS,
    NAMESPACE,
    POLICIES,
    RECONCILES,
    SCALE_STEP,
    STATUS_INTERVAL,
    say,
)
from polyrl.bench.operator_pods import (
    active_rollouts,
    all_running,
    leaving_rollouts,
    new_rollouts,
    nth_time,
    pods_of_job,
    rollouts_of,
)
from polyrl.bench.operator_stack import Env, environment
from polyrl.testing.waiting import wait_until


@dataclass(frozen=True, slots=True)
class Config:
    quick: bool
    apply_jobs: int
    scale_repeats: int
    idle_jobs: int
    idle_window_s: float
    quiet_timeout_s: float
    serving_step: int  # rollout pods added to a real job, timed to Running and to serving
    status_interval_s: float = STATUS_INTERVAL


def config(*, quick: bool) -> Config:
    if quick:
        return Config(
            quick=True,
            apply_jobs=2,
            scale_repeats=3,
            idle_jobs=5,
            idle_window_s=5.0,
            quiet_timeout_s=4.0,
            serving_step=1,
        )
    return Config(
        quick=False,
        apply_jobs=10,
        scale_repeats=20,
        idle_jobs=50,
        idle_window_s=30.0,
        quiet_timeout_s=15.0,
        serving_step=SCALE_STEP,
    )


# --- small figures ------------------------------------------------------------------------


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
    wait_until(
        f"{count} RLJobs Running",
        lambda: sum(p == "Running" for p in job_phases(api).values()) >= count or None,
        timeout=timeout,
        interval=0.5,
    )
    return time.monotonic() - started


# --- pod watch ----------------------------------------------------------------------------


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
    # Before the idle jobs: a real job's workers start beside the fewest other objects, and
    # it is gone again (pods, streams) before the idle window opens.
    serving = operator_serving.measure(env.api, env.kubectl, cfg.serving_step)
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
        **serving.figures(),
    }


def run(*, quick: bool) -> dict[str, Any]:
    cfg = config(quick=quick)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-") as tmp, environment(Path(tmp)) as env:
        figures = measure(env, cfg)
    figures["total_s"] = round(time.monotonic() - started, 1)
    say(f"done in {figures['total_s']:.0f}s")
    return figures
