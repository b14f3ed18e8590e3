"""One engine measured in its own interpreter: `python -m polyrl.bench.engine_probe SPEC OUT`.

`polyrl bench engine` compares the torch and vLLM engines, which live in different Python
environments (vLLM's CPU build needs its own torch). So each is measured by this module, run
with its environment's interpreter on the same checkpoint and the same prompts (SPEC, a JSON
file), and writes its figures and its last batch's tokens and log-probs to OUT (JSON), which
the benchmark scores against the trainer's own forward pass.

Figures: `import_s` (importing the engine's library), `load_s` (building the engine from the
checkpoint), `first_token_s` (median time for the batch to produce one token each: prefill
and the first decode step) and `generate_s` (median time for the whole batch). A SPEC with
`batches` (a list of sizes) and `dtype` measures each batch size in turn (the first that
many prompts) with the engine computing in that dtype, into `runs`.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    import torch

    from polyrl.workers.rollout.engines import make_engine

    if spec["engine"] == "vllm":
        import vllm  # noqa: F401  (timed here: its import is most of a worker's start)
    imported = time.perf_counter()
    model: Any = spec["model"]
    options: dict[str, Any] = {"max_batch_size": len(spec["prompts"])}
    dtype = spec.get("dtype")
    if spec["engine"] == "torch":
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(spec["threads"])
        model = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype="auto")
        if dtype is not None:
            options["compute_dtype"] = getattr(torch, dtype)
    else:
        options["max_model_len"] = spec["max_model_len"]
        if dtype is not None:
            options["dtype"] = dtype
    engine = make_engine(spec["engine"], model, **options)
    loaded = time.perf_counter()
    figures = {
        "device": engine.device,
        "import_s": round(imported - started, 2),
        "load_s": round(loaded - imported, 2),
    }
    if "batches" in spec:
        runs = [_timed_run(engine, spec, spec["prompts"][:size]) for size in spec["batches"]]
        return figures | {"runs": runs} | runs[-1]
    return figures | _timed_run(engine, spec, spec["prompts"])


def _timed_run(engine: Any, spec: dict[str, Any], prompts: list[list[int]]) -> dict[str, Any]:
    """Medians over `repeats` rounds (after one warm-up) of one batch of `prompts`."""
    from polyrl.workers.rollout.engines.base import SamplingParams

    params = SamplingParams(
        max_new_tokens=spec["new_tokens"], temperature=spec["temperature"], seed=0
    )
    first = SamplingParams(max_new_tokens=1, temperature=spec["temperature"], seed=0)
    first_token, whole = [], []
    for repeat in range(spec["repeats"] + 1):  # the first round warms up
        t0 = time.perf_counter()
        engine.generate(prompts, first)
        t1 = time.perf_counter()
        results = engine.generate(prompts, params)
        t2 = time.perf_counter()
        if repeat:
            first_token.append(t1 - t0)
            whole.append(t2 - t1)
    return {
        "batch": len(prompts),
        "first_token_s": statistics.median(first_token),
        "generate_s": statistics.median(whole),
        "tokens": [r.tokens for r in results],
        "logprobs": [r.logprobs for r in results],
    }


def main(argv: list[str]) -> int:
    spec_file, out = Path(argv[0]), Path(argv[1])
    out.write_text(json.dumps(measure(json.loads(spec_file.read_text()))))
    return 0


if __name__ == "__main__":  # vLLM's engine may spawn processes: the guard is needed
    sys.exit(main(sys.argv[1:]))
