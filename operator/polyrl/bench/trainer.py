"""`polyrl bench trainer`: padded against packed micro-batches on long-tailed lengths.

The same GRPO batch, whose completion lengths have a long tail (log-normal: most short, a few
near the limit, as reasoning and multi-turn traces have), trained by the trainer's `Learner`
two ways, each in a fresh interpreter (`trainer_probe`) so each peak resident memory is its
own: padded (`microBatchSize` rows, each padded to its longest) and packed
(`microBatchTokens`, about as many real tokens per micro-batch). For each: real tokens
trained per second (the better of two alternated runs; one with `--quick`), the share of the padded tensors that is padding, peak memory of the
steps; and the largest difference between the two paths' log-probs of the batch (float32,
the model's weights as loaded). Ratios compare the two in the same run.

Without `--model` a tiny built-in Llama (the logic, in seconds); with `--model` that Hugging
Face directory (SmolLM2-135M: `polyrl models fetch --dequantize`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from polyrl.bench import probe

PROBE = "polyrl.bench.trainer_probe"
TINY = "tiny-llama://bench-trainer"


def run(*, quick: bool, model: Path | None = None) -> dict[str, Any]:
    big = model is not None
    spec = {
        "model": str(model) if big else TINY,
        "threads": 2,
        "samples": 32 if big or quick else 64,
        "prompt": 32,
        "median_completion": 24 if big else 16,
        "max_completion": 384 if big else 256,
        "steps": 1 if quick else 2,
        "rows": 8,
    }
    figures: dict[str, Any] = {"model": spec["model"]}
    runs: dict[str, list[dict[str, Any]]] = {"padded": [], "packed": []}
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-trainer-") as scratch:
        for _ in range(1 if quick else 2):  # alternated, so that a busy spell hits both
            for mode, got in runs.items():
                got.append(probe.run(PROBE, mode, spec | {"mode": mode}, Path(scratch)))
    for mode, got in runs.items():
        best = max(got, key=lambda g: g["tokens_per_second"])  # the least disturbed
        figures |= {f"{mode}_{key}": value for key, value in best.items()}
        figures[f"{mode}_peak_rss_gb"] = max(g["peak_rss_gb"] for g in got)
    figures["packed_vs_padded_tokens_per_second"] = round(
        figures["packed_tokens_per_second"] / figures["padded_tokens_per_second"], 3
    )
    figures["packed_vs_padded_peak_memory"] = round(
        figures["packed_peak_rss_gb"] / figures["padded_peak_rss_gb"], 3
    )
    return figures
