"""`polyrl bench scale`: 3 policies with 1 to 64 simulated rollout replicas each.

Each replica is a real rollout worker with its own NATS connection over `SimulatedEngine`,
whose every call takes `CALL_SECONDS` of wall time (compression 1: a replica of a fast GPU
answering `PER_CALL` requests of `GROUP` samples at once), so what `R` replicas could supply
is known exactly: `capacity_samples_per_s = 3 * R * PER_CALL * GROUP / CALL_SECONDS`. The
workflow runner (`rotating`: one group per episode, the policies in turn) and the three
trainers (`SimulatedTrainer`, their step free) are real as well, on an embedded nats-server
(`polyrl.bench.simulation`); the replicas and trainers share this process.

Per replica count: samples/s stored on the trajectory streams (`trained_per_s`: taken by the
trainers, in whole batches) over a window after a warm-up, against
the capacity; CPU time per sample (`orchestration_us_per_sample`) in all and split: each
workflow runner runs in a process of its own (`runner_process`, as in a pod:
`runner_us_per_sample`, `runner_cpu_share` of one core), the replicas and trainers share this
one (`replicas_trainers_us_per_sample`, `process_cpu_share`), and nats-server's (all three:
`machine_cpu_share` of every core);
request-queue fairness (`fairness_max_over_min`: the most requests a replica of a policy
served in the window over the fewest); and the part at its limit (`saturated`). The largest
count runs twice more: with the runner awaiting each trajectory's acknowledgement before the
next (`publish_window: 1`, the runner before its publish window) and with two runners.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import time
from pathlib import Path
from typing import Any

from polyrl.bench import simulation
from polyrl.workers.runtime.simulation import LatencyModel, TrainCost

POLICIES = ("alpha", "beta", "gamma")
CALL_SECONDS, PER_CALL, GROUP, NEW_TOKENS, BATCH = 0.5, 4, 8, 16, 128
# Generation may run this many batches ahead: 33 * 128 samples per policy are 528 requests,
# room for 64 replicas' calls in flight and one queued behind each.
MAX_STALENESS = 32
CORES = os.cpu_count() or 1
QUICK = {"replicas": (1, 4), "warmup": 2.0, "window": 3.0}
FULL = {"replicas": (1, 8, 32, 64), "warmup": 6.0, "window": 12.0}


def setup(replicas: int, **changes: Any) -> simulation.Setup:
    # Every call lasts CALL_SECONDS whatever it holds: the cost is the call's overhead.
    model = LatencyModel(prefill=0.0, decode=0.0, overhead=CALL_SECONDS, tail=0.0,
                         median_tokens=NEW_TOKENS)  # fmt: skip
    base = simulation.Setup(
        model=model, cost=TrainCost(), compression=1.0, policies=POLICIES, replicas=replicas,
        batch=BATCH, group=GROUP, requests_per_call=PER_CALL, new_tokens=NEW_TOKENS,
        max_staleness=MAX_STALENESS,
        # enough episodes to keep every replica's next call queued behind its current one
        episodes_in_flight=max(64, 2 * len(POLICIES) * replicas * PER_CALL),
        runner_processes=True,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def _cpu_seconds(pid: int) -> float:
    """A process's user and system CPU seconds so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(url: str, nats_pid: int | None, bundle: Path, config: simulation.Setup,
                  *, warmup: float, window: float) -> dict[str, Any]:  # fmt: skip
    job = simulation.SimulatedJob(url, config)
    await job.start(bundle, steps=None)
    try:
        await asyncio.sleep(warmup)
        stored0, trained0, served0 = await job.stored(), job.trained(), _served(job)
        runner_pids = [proc.pid for proc in job.runner_procs]
        runners0 = [_cpu_seconds(pid) for pid in runner_pids]
        cpu0, nats0 = time.process_time(), _cpu_seconds(nats_pid) if nats_pid else 0.0
        started = time.monotonic()
        await asyncio.sleep(window)
        seconds = time.monotonic() - started
        cpu = time.process_time() - cpu0
        nats_cpu = (_cpu_seconds(nats_pid) - nats0) if nats_pid else 0.0
        runner_cpu = [_cpu_seconds(pid) - c for pid, c in zip(runner_pids, runners0, strict=True)]
        samples, trained = await job.stored() - stored0, job.trained() - trained0
        served = {k: v - served0[k] for k, v in _served(job).items()}
    finally:
        await job.stop()
    failed = job.failed
    capacity = len(POLICIES) * config.replicas * PER_CALL * GROUP / CALL_SECONDS
    rate = samples / seconds
    figures: dict[str, Any] = {
        "replicas_per_policy": config.replicas,
        "runners": config.runners,
        "capacity_samples_per_s": round(capacity, 1),
        "samples_per_s": round(rate, 1),
        "trained_per_s": round(trained / seconds, 1),
        "of_capacity": round(rate / capacity, 3),
        "orchestration_us_per_sample": _per_sample(cpu + sum(runner_cpu) + nats_cpu, samples),
        "runner_us_per_sample": _per_sample(sum(runner_cpu), samples),
        "replicas_trainers_us_per_sample": _per_sample(cpu, samples),
        "nats_us_per_sample": _per_sample(nats_cpu, samples),
        "runner_cpu_share": round(max(runner_cpu) / seconds, 3),
        "machine_cpu_share": round((cpu + sum(runner_cpu) + nats_cpu) / seconds / CORES, 3),
        "process_cpu_share": round(cpu / seconds, 3),
        "nats_cpu_share": round(nats_cpu / seconds, 3),
        "fairness_max_over_min": _fairness(served, config.replicas),
        "episodes_failed": failed,
    }
    figures["saturated"] = _saturated(figures)
    return figures


def _per_sample(cpu: float, samples: int) -> float | None:
    return round(1e6 * cpu / samples, 1) if samples else None


def _served(job: simulation.SimulatedJob) -> dict[str, int]:
    return {w.rt.pod: w.served for workers in job.rollouts.values() for w in workers}


def _fairness(served: dict[str, int], replicas: int) -> float | None:
    """The worst policy's max/min requests served per replica (1.0: perfectly even)."""
    worst = 1.0
    for policy in POLICIES:
        counts = [n for pod, n in served.items() if pod.startswith(f"{policy}-")]
        if len(counts) != replicas or min(counts) == 0:
            return None  # a replica served nothing in the window
        worst = max(worst, max(counts) / min(counts))
    return round(worst, 2)


def _saturated(figures: dict[str, Any]) -> str:
    """What holds the rate below capacity: the machine's cores, a workflow runner's core, the
    core the replicas and trainers share in this process, nats-server, or nothing (within
    10% of capacity)."""
    if figures["of_capacity"] >= 0.9:
        return "none (the replicas)"
    if figures["machine_cpu_share"] >= 0.85:
        return f"the machine's {CORES} cores (runner, replicas and nats-server together)"
    if figures["runner_cpu_share"] >= 0.85:
        return "workflow runner CPU"
    if figures["process_cpu_share"] >= 0.85:
        return "replicas' and trainers' process CPU (one event loop)"
    if figures["nats_cpu_share"] >= 0.85:
        return "nats-server CPU"
    return "latency (round trips, not CPU)"


async def _measure(url: str, nats_pid: int | None, bundle: Path, *, quick: bool) -> dict[str, Any]:
    knobs: dict[str, Any] = QUICK if quick else FULL
    timing = {"warmup": knobs["warmup"], "window": knobs["window"]}
    rows = [await measure(url, nats_pid, bundle, setup(n), **timing) for n in knobs["replicas"]]
    largest = knobs["replicas"][-1]
    awaited = await measure(url, nats_pid, bundle, setup(largest, publish_window=1), **timing)
    two_runners = await measure(url, nats_pid, bundle, setup(largest, runners=2), **timing)
    return {
        "quick": quick, "policies": len(POLICIES), "call_seconds": CALL_SECONDS,
        "requests_per_call": PER_CALL, "group": GROUP, "new_tokens": NEW_TOKENS,
        "rows": rows,
        "max_samples_per_s": max(r["samples_per_s"] for r in rows),
        "largest_awaited_publishes": awaited,
        "largest_two_runners": two_runners,
        "window_over_awaited": round(rows[-1]["samples_per_s"] / awaited["samples_per_s"], 2)
        if awaited["samples_per_s"] else None,
    }  # fmt: skip


def run(*, quick: bool) -> dict[str, Any]:
    return simulation.run_on_server("scale", functools.partial(_measure, quick=quick))
