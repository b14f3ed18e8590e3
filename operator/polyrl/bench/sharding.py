"""`polyrl bench sharding`: what each trainer rank holds under ddp and fsdp2, and what
sharded checkpoints and publication cost.

The same GRPO batch (`trainer_probe.samples`: long-tailed lengths), trained on 2 CPU ranks
(gloo) by the trainer's `Learner`, once data-parallel and once sharded, each in a fresh
interpreter (`sharding_probe`) so each peak resident memory is its own. For each, rank 0's
figures: parameter, gradient and AdamW bytes it holds (DTensor `to_local()` sizes), peak
resident memory of the steps, the median step, and two publications as each trainer makes
them (a keyframe before the steps, a delta after): time, bytes, rank 0's peak resident
memory and the largest rise of any rank's above what it held before. The sharded
run also writes a distributed checkpoint, which a third process resumes on one rank
(resharding 2 -> 1): save and load times, and whether that rank's next loss is the
uninterrupted run's. Ratios compare fsdp2 with ddp in the same run.

Without `--model` a tiny built-in Llama (the logic, in seconds); with `--model` that Hugging
Face directory (SmolLM2-135M: `polyrl models fetch --dequantize`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from polyrl.bench import probe

PROBE = "polyrl.bench.sharding_probe"
TINY = "tiny-llama://bench-sharding"
HELD = ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "peak_rss_gb")
PUBLISHED = tuple(
    f"publish_{kind}_{figure}"
    for kind in ("keyframe", "delta")
    for figure in ("s", "bytes", "peak_rss_gb", "max_rise_gb")
)


def run(*, quick: bool, model: Path | None = None) -> dict[str, Any]:
    big = model is not None
    spec = {
        "model": str(model) if big else TINY,
        "threads": 1,  # one per rank: 2 ranks on 2 cores
        "samples": 16 if big or quick else 32,
        "prompt": 32,
        "median_completion": 24 if big else 16,
        "max_completion": 128,
        "steps": 2 if quick else 3,
        "rows": 4,
    }
    figures: dict[str, Any] = {"model": spec["model"], "ranks": 2}
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-sharding-") as scratch:
        for strategy in ("ddp", "fsdp2"):
            got = probe.run(PROBE, strategy, spec | {"strategy": strategy}, Path(scratch))
            figures |= {f"{strategy}_{key}": value for key, value in got.items()}
    for key in (*HELD, "rss_before_steps_gb", "step_s", *PUBLISHED):
        ddp = figures[f"ddp_{key}"]  # a rise in memory can be nil
        figures[f"fsdp2_vs_ddp_{key}"] = round(figures[f"fsdp2_{key}"] / ddp, 3) if ddp else None
    return figures
