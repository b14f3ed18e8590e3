"""`polyrl bench engine`, its torch-against-vLLM part: the same batches through both engines.

A tiny Llama with a byte-level BPE vocabulary and 64-wide heads (`tiny-bpe://llama/...`, the
vLLM example's model shape), in float32, is saved once; each engine loads it in its own
interpreter (`engine_probe`: the torch engine in this one, vLLM in the vLLM environment) and
generates the same batch of arithmetic prompts, `GROUP` samples each, `NEW_TOKENS` tokens at
temperature 1, after one warm-up round. Both use every core (vLLM binds its threads to them,
the torch engine is given as many). The trainer's view is a float32 teacher-forced pass
through transformers over each engine's own tokens: `*_logprob_max_diff` is how far each
engine's log-probs are from it (what truncated importance sampling divides by).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from polyrl.api.resources import ModelSource, TaskSpec
from polyrl.local import environments
from polyrl.workers import tasks
from polyrl.workers.models import loading as models
from polyrl.workers.trainer import batching

PROMPTS, GROUP, NEW_TOKENS, TEMPERATURE = 16, 8, 16, 1.0
PROBE_TIMEOUT = 600
# `--model`: a real model's figures per engine, compute dtype and batch size.
BATCHES, DTYPES, MODEL_NEW_TOKENS = (1, 8, 32), ("float32", "bfloat16"), 32


def vllm_python() -> Path | None:
    """The vLLM environment's interpreter, where `polyrl run` would find it; None if none."""
    for env in environments.candidates(None):
        if (env / "bin" / "python").is_file() and (env / "bin" / "polyrl").is_file():
            return env / "bin" / "python"
    return None


def run(python: Path, *, workdir: Path, quick: bool) -> dict[str, Any]:
    source = ModelSource(path="tiny-bpe://llama/bench-engine", dtype="float32")
    model, tokenizer = models.make_model(source, cache_dir=workdir / "models")
    models.export(model, tokenizer, workdir / "model")
    task = tasks.load_task(TaskSpec(name="arithmetic", params={"digits": 2}))
    rng = random.Random(0)
    prompts = [tokenizer(task.sample(rng).prompt)["input_ids"] for _ in range(PROMPTS)]
    batch = [p for p in prompts for _ in range(GROUP)]
    spec = {
        "model": str(workdir / "model"),
        "prompts": batch,
        "new_tokens": NEW_TOKENS,
        "temperature": TEMPERATURE,
        "repeats": 2 if quick else 5,
        "threads": os.cpu_count() or 1,
        "max_model_len": 128,
    }
    (workdir / "spec.json").write_text(json.dumps(spec))
    found = {
        "torch": _probe(Path(sys.executable), "torch", workdir),
        "vllm": _probe(python, "vllm", workdir),
    }
    figures: dict[str, Any] = {"vllm_batch": len(batch), "vllm_new_tokens": NEW_TOKENS}
    for name, probe in found.items():
        tokens = sum(len(t) for t in probe["tokens"])
        figures |= {
            f"{name}_import_s": probe["import_s"],
            f"{name}_load_s": probe["load_s"],
            f"{name}_first_token_s": round(probe["first_token_s"], 4),
            f"{name}_tokens_per_s": round(tokens / probe["generate_s"], 1),
            f"{name}_logprob_max_diff": _gap(model, batch, probe),
        }
    figures["vllm_vs_torch_tokens_per_s"] = round(
        figures["vllm_tokens_per_s"] / figures["torch_tokens_per_s"], 2
    )
    return figures


def model_matrix(
    python: Path | None, model_dir: Path, *, workdir: Path, quick: bool
) -> dict[str, Any]:
    """Torch against vLLM on `model_dir` (a chat model): tokens/s and first-token latency at
    each batch size in `BATCHES`, computing in each dtype of `DTYPES`, on 32 distinct chat
    prompts (two-digit sums), `MODEL_NEW_TOKENS` tokens at temperature 1; and each engine's
    largest log-prob gap to the float32 trainer at the largest batch. vLLM is skipped (and
    said so) where its environment is missing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    rng = random.Random(0)
    questions = [f"What is {rng.randrange(10, 100)} + {rng.randrange(10, 100)}?" for _ in range(32)]
    prompts: list[list[int]] = [_chat_ids(tokenizer, q) for q in questions]
    spec = {
        "model": str(model_dir),
        "prompts": prompts,
        "new_tokens": MODEL_NEW_TOKENS,
        "temperature": TEMPERATURE,
        "repeats": 1 if quick else 3,
        "threads": os.cpu_count() or 1,
        "max_model_len": 256,
        "batches": list(BATCHES),
    }
    (workdir / "spec.json").write_text(json.dumps(spec))
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    figures: dict[str, Any] = {"model": str(model_dir), "new_tokens": MODEL_NEW_TOKENS}
    engines = {"torch": Path(sys.executable)} | ({"vllm": python} if python else {})
    for engine, interpreter in engines.items():
        for dtype in DTYPES:
            probe = _probe(interpreter, engine, workdir, dtype=dtype)
            key = f"{engine}_{dtype}"
            figures[f"{key}_load_s"] = probe["load_s"]
            for run in probe["runs"]:
                tokens = sum(len(t) for t in run["tokens"])
                figures[f"{key}_b{run['batch']}_tokens_per_s"] = round(
                    tokens / run["generate_s"], 1
                )
                figures[f"{key}_b{run['batch']}_first_token_s"] = round(run["first_token_s"], 4)
            figures[f"{key}_logprob_max_diff"] = _gap(trainer, prompts, probe)
    if python is not None:
        for dtype in DTYPES:
            for batch in BATCHES:
                vllm = figures[f"vllm_{dtype}_b{batch}_tokens_per_s"]
                figures[f"vllm_vs_torch_{dtype}_b{batch}"] = round(
                    vllm / figures[f"torch_{dtype}_b{batch}_tokens_per_s"], 2
                )
    figures["vllm_measured"] = python is not None
    return figures


def _chat_ids(tokenizer: Any, question: str) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True,
        return_dict=True,
    )  # fmt: skip
    return [int(i) for i in encoded["input_ids"]]


def _probe(python: Path, engine: str, workdir: Path, *, dtype: str | None = None) -> dict[str, Any]:
    name = engine if dtype is None else f"{engine}-{dtype}"
    spec = json.loads((workdir / "spec.json").read_text()) | {"engine": engine}
    if dtype is not None:
        spec["dtype"] = dtype
    (workdir / f"{name}.spec.json").write_text(json.dumps(spec))
    out = workdir / f"{name}.out.json"
    print(f"engine bench: measuring {name} ({python})", file=sys.stderr, flush=True)
    proc = subprocess.run(
        [str(python), "-m", "polyrl.bench.engine_probe", str(workdir / f"{name}.spec.json"), out],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the {name} engine probe failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _gap(model: Any, prompts: list[list[int]], probe: dict[str, Any]) -> float:
    """Largest |engine log-prob - trainer log-prob| over every generated token."""
    worst = 0.0
    for prompt, tokens, logprobs in zip(prompts, probe["tokens"], probe["logprobs"], strict=True):
        ids = torch.tensor([prompt + tokens])
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[0, len(prompt) :] = True
        with torch.inference_mode():
            logits = model(input_ids=ids).logits
            trainer = batching.token_logprobs(logits, ids, mask, TEMPERATURE)[mask]
        worst = max(worst, float((trainer - torch.tensor(logprobs)).abs().max()))
    return round(worst, 7)
