"""`polyrl bench pipeline --simulated`: async against sync where each has its own hardware.

On this machine generation and training share the cores, so `polyrl bench pipeline` measures
contention as much as design. Here both are modelled (`polyrl.bench.simulation`): rollout
replicas take the time `LatencyModel` says a batch takes, the trainer the time `TrainCost`
says, and everything between is the real system. Each cell of the grid runs the same job in
sync mode and in async mode, one after the other on one nats-server, and compares steady
steps (the first, which fills the pipeline, left out).

The grid: generation to training time `ratio` in {0.25, 1, 4} by a light or heavy long tail of
response lengths, on 4 replicas of one speed; and one cell on mixed hardware (two of the
replicas at half the speed: sync rounds wait for the slow ones). Generation time is `t_gen`, a batch's generation with every replica busy
(what async mode pays per batch when generation is the slower side); a sync step also waits
for the batch's slowest replica, `t_makespan`. Both come from a Monte Carlo of the latency
model alone, without NATS (`runtime.simulation.expected_times`), and give
`ideal_speedup = (t_makespan + t_train) / max(t_gen, t_train)`. `speedup_vs_ideal` is the
measured speedup over it. Modelled time runs `compression` times faster than wall time,
chosen per cell so a sync step lasts about `step_wall` seconds. `{mode}_realized_s_per_step`
is the model's prediction for the lengths actually drawn in the run (sync: each round's
slowest call and its training step; async: the replicas' modelled work per batch or the
training step, whichever is longer), and `{mode}_orchestration_ms_per_step` what each wall
step took beyond it: the system's own cost, in wall time.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from pathlib import Path
from typing import Any

from polyrl.bench import simulation
from polyrl.workers.runtime.simulation import (
    LatencyModel,
    Shape,
    TrainCost,
    expected_batch_tokens,
    expected_times,
    ideal_speedup,
)

REPLICAS, BATCH, GROUP, PER_CALL, PROMPT_TOKENS, LIMIT = 4, 128, 8, 4, 10, 4096
TAILS = {"light": 0.3, "heavy": 1.0}
RATIOS = (0.25, 1.0, 4.0)
# Replica speed factors: one hardware type, or two (half the replicas at half the speed).
HARDWARE = {"uniform": (1.0,) * REPLICAS, "mixed": (1.0, 1.0, 0.5, 0.5)}
QUICK = {"steps": 4, "step_wall": 1.0,
         "cells": [("light", 1.0, "uniform"), ("heavy", 1.0, "uniform")]}  # fmt: skip
FULL = {"steps": 12, "step_wall": 4.0,
        "cells": [(t, r, "uniform") for t in TAILS for r in RATIOS] + [("heavy", 1.0, "mixed")]}  # fmt: skip
PLOTTED = (
    "heavy",
    1.0,
    "uniform",
)  # the cell whose throughput over time is returned for the docs' plot


def latency(tail: str) -> LatencyModel:
    return LatencyModel(prefill=1e-3, decode=0.05, median_tokens=256, tail=TAILS[tail])


def shape(hardware: str) -> Shape:
    return Shape(batch=BATCH, group=GROUP, speeds=HARDWARE[hardware],
                 requests_per_call=PER_CALL, prompt_tokens=PROMPT_TOKENS, limit=LIMIT)  # fmt: skip


def plan(tail: str, ratio: float, hardware: str, step_wall: float) -> dict[str, Any]:
    """The cell's modelled figures and the setup both modes run."""
    model = latency(tail)
    t_makespan, t_gen = expected_times(model, shape(hardware))
    t_train = t_gen / ratio
    tokens = expected_batch_tokens(model, shape(hardware))
    compression = (t_makespan + t_train) / step_wall
    setup = simulation.Setup(
        model=model, cost=TrainCost(per_token=t_train / tokens), compression=compression,
        replicas=REPLICAS, batch=BATCH, group=GROUP, requests_per_call=PER_CALL,
        new_tokens=LIMIT, episodes_in_flight=64, speeds=HARDWARE[hardware],
    )  # fmt: skip
    return {
        "tail": tail, "ratio": ratio, "hardware": hardware, "speeds": list(HARDWARE[hardware]),
        "tail_sigma": TAILS[tail], "t_gen": t_gen,
        "t_makespan": t_makespan, "t_train": t_train, "compression": compression,
        "ideal_speedup": ideal_speedup(t_makespan, t_gen, t_train), "setup": setup,
    }  # fmt: skip


async def run_mode(url: str, bundle: Path, setup: simulation.Setup, steps: int) -> dict[str, Any]:
    job = simulation.SimulatedJob(url, setup)
    started = time.monotonic()
    await job.start(bundle, steps=steps)
    try:
        await job.finished(timeout=60 + 10 * steps * 4.0)
    finally:
        await job.stop()
    records = job.trainers[0].records
    steady = (records[-1]["time"] - records[0]["time"]) / (len(records) - 1)
    spans = sorted(span for engine in job.engines() for span in engine.spans)
    series, samples = [], 0
    for record in records:  # samples trained by each step's end, in modelled seconds
        samples += record["samples"]
        series.append([round((record["time"] - started) * setup.compression, 1), samples])
    return {
        "wall_s_per_step": steady,
        "modelled_s_per_step": steady * setup.compression,
        "mean_staleness": sum(r["staleness"] for r in records) / len(records),
        "stale_dropped": job.trainers[0].dropped,
        "series": series,
        "realized_s_per_step": realized(setup, records, spans),
    }


def realized(setup: simulation.Setup, records: list[dict[str, Any]],
             spans: list[tuple[float, float]]) -> float:  # fmt: skip
    """The modelled seconds a steady step would take with the lengths actually drawn (the
    model's prediction for this run, without its sampling noise): sync, each round's slowest
    call and its training; async, the replicas' modelled work per batch or the training,
    whichever is longer. Steps 2.. (as `wall_s_per_step`)."""
    steps = list(itertools.pairwise(records))
    train: list[float] = [b["modelled_seconds"] for _, b in steps]
    if setup.mode == "sync":  # a round starts once the step before has ended
        rounds: list[float] = [
            max((m for t, m in spans if a["time"] <= t < b["time"]), default=0.0)
            + b["modelled_seconds"]
            for a, b in steps
        ]
        return sum(rounds) / len(rounds)
    window = [m for t, m in spans if records[0]["time"] <= t < records[-1]["time"]]
    generation = sum(window) / setup.replicas / len(steps)
    return max(generation, sum(train) / len(train))


async def cell(url: str, bundle: Path, key: tuple[str, float, str], quick: bool) -> dict[str, Any]:
    knobs: dict[str, Any] = QUICK if quick else FULL
    planned = plan(*key, step_wall=knobs["step_wall"])
    setup: simulation.Setup = planned.pop("setup")
    modes = {}
    for mode in ("sync", "async"):
        modes[mode] = await run_mode(url, bundle, _with(setup, mode=mode), knobs["steps"])
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in planned.items()}
    for mode, figures in modes.items():
        overhead = (
            figures["modelled_s_per_step"] - figures["realized_s_per_step"]
        ) / setup.compression
        out[f"{mode}_modelled_s_per_step"] = round(figures["modelled_s_per_step"], 2)
        out[f"{mode}_realized_s_per_step"] = round(figures["realized_s_per_step"], 2)
        out[f"{mode}_wall_s_per_step"] = round(figures["wall_s_per_step"], 3)
        out[f"{mode}_orchestration_ms_per_step"] = round(1000 * overhead, 1)
        out[f"{mode}_mean_staleness"] = round(figures["mean_staleness"], 2)
        out[f"{mode}_stale_dropped"] = figures["stale_dropped"]
        if key == PLOTTED:
            out[f"{mode}_series"] = figures["series"]
    speedup = modes["sync"]["wall_s_per_step"] / modes["async"]["wall_s_per_step"]
    out["async_vs_sync_speedup"] = round(speedup, 3)
    out["speedup_vs_ideal"] = round(speedup / planned["ideal_speedup"], 3)
    # The model's own speedup for the lengths this run drew: what is left of the gap is the
    # system's (orchestration), not the draw's.
    drawn = modes["sync"]["realized_s_per_step"] / modes["async"]["realized_s_per_step"]
    out["realized_speedup"] = round(drawn, 3)
    out["speedup_vs_realized"] = round(speedup / drawn, 3)
    return out


def _with(setup: simulation.Setup, **changes: Any) -> simulation.Setup:
    return dataclasses.replace(setup, **changes)


async def _measure(url: str, nats_pid: int | None, bundle: Path, *, quick: bool) -> dict[str, Any]:
    knobs: dict[str, Any] = QUICK if quick else FULL
    cells = [await cell(url, bundle, key, quick) for key in knobs["cells"]]
    return {
        "quick": quick, "simulated": True, "steps": knobs["steps"], "replicas": REPLICAS,
        "batch": BATCH, "group": GROUP, "requests_per_call": PER_CALL,
        "cells": cells,
        "min_speedup_vs_ideal": min(c["speedup_vs_ideal"] for c in cells),
    }  # fmt: skip


def run(*, quick: bool) -> dict[str, Any]:
    return simulation.run_on_server("simulated", functools.partial(_measure, quick=quick))
