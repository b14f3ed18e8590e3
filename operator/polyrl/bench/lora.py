"""`polyrl bench lora`: what LoRA costs and saves against full fine-tuning, side by side.

Every configuration runs in a fresh interpreter (`lora_probe`), one after another, so each
peak resident memory is its own. Three trainers on the same model and the same synthetic
GRPO batch: full fine-tuning, LoRA rank 8 and LoRA rank 16 (every linear layer of the
attention and MLP blocks, alpha 2 x rank); for each, peak memory and median step time, and
the bytes one weight version puts on the wire: the whole model, its sparse delta (what full
training and `lora.sync: merged` send), the adapter and the adapter's delta (what
`lora.sync: adapter` sends). Then serving: one torch engine with one policy's adapter, and
one engine shared by two policies (`rollout.servedBy`), each slot's batch in turn; two
separate pools cost twice the one-policy engine.

Without `--model` it runs on a tiny built-in Llama (the logic, in seconds); with `--model`
on that Hugging Face directory (SmolLM2-135M: `polyrl models fetch --dequantize`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from polyrl.bench import probe

TINY = "tiny-llama://bench-lora"


def run(*, quick: bool, model: Path | None = None) -> dict[str, Any]:
    path = str(model) if model is not None else TINY
    big = model is not None
    train = {
        "kind": "train", "model": path, "threads": 2, "lr": 1e-5,
        "steps": 2 if quick else 3, "samples": 64 if big and not quick else 16,
        "prompt": 40, "completion": 16,
    }  # fmt: skip
    serve = {
        "kind": "serve", "model": path, "threads": 2, "rank": 16,
        "batch": 32 if big else 8, "prompt": 24, "completion": 8 if quick else 16,
    }  # fmt: skip
    figures: dict[str, Any] = {"model": path}
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-lora-") as scratch:
        for name, rank, lr in (("full", None, 1e-5), ("lora_r8", 8, 1e-4), ("lora_r16", 16, 1e-4)):
            got = _probe(train | {"rank": rank, "lr": lr}, Path(scratch))
            figures |= {f"{name}_{key}": value for key, value in got.items()}
        one = _probe(serve | {"slots": ["solver"]}, Path(scratch))
        shared = _probe(serve | {"slots": ["solver", "verifier"]}, Path(scratch))
    figures |= {f"serve_one_{k}": v for k, v in one.items()}
    figures |= {f"serve_shared_{k}": v for k, v in shared.items()}
    return figures | _ratios(figures)


def _ratios(f: dict[str, Any]) -> dict[str, float]:
    """The comparisons the benchmark is for, each against a baseline of the same run."""
    ratios = {
        "shared_vs_one_pool_memory": f["serve_shared_peak_rss_gb"] / f["serve_one_peak_rss_gb"],
        "shared_vs_two_pools_memory": f["serve_shared_peak_rss_gb"]
        / (2 * f["serve_one_peak_rss_gb"]),
    }
    for name in ("lora_r8", "lora_r16"):
        ratios[f"{name}_vs_full_memory"] = f[f"{name}_peak_rss_gb"] / f["full_peak_rss_gb"]
        ratios[f"{name}_vs_full_step_time"] = f[f"{name}_step_s"] / f["full_step_s"]
        ratios[f"{name}_adapter_delta_vs_model_delta_bytes"] = (
            f[f"{name}_adapter_delta_bytes"] / f["full_model_delta_bytes"]
        )
        ratios[f"{name}_adapter_vs_model_bytes"] = (
            f[f"{name}_adapter_bytes"] / f["full_model_bytes"]
        )
    return {k: round(v, 4) for k, v in ratios.items()}


def _probe(spec: dict[str, Any], scratch: Path) -> dict[str, Any]:
    name = f"{spec['kind']}-{spec.get('rank')}-{len(spec.get('slots', []))}"
    return probe.run("polyrl.bench.lora_probe", name, spec, scratch)
