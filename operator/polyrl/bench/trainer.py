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

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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
                got.append(_probe(spec | {"mode": mode}, Path(scratch)))
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


def _probe(spec: dict[str, Any], scratch: Path) -> dict[str, Any]:
    spec_file, out = scratch / f"{spec['mode']}.json", scratch / f"{spec['mode']}-out.json"
    spec_file.write_text(json.dumps(spec))
    command = [sys.executable, "-m", "polyrl.bench.trainer_probe", str(spec_file), str(out)]
    print(f"trainer bench: {spec['mode']} ...", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, stdout=sys.stderr)
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures
