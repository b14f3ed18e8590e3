"""One trainer measurement in its own interpreter: `python -m polyrl.bench.trainer_probe SPEC OUT`.

`polyrl bench trainer` runs the padded and the packed path each in a fresh process, so that
each peak resident memory is its own. SPEC (JSON): the model, the batch (`samples` of
`prompt` tokens and log-normal completion lengths with median `median_completion`, capped at
`max_completion`), `steps`, and `mode`: padded (micro-batches of `rows` samples) or packed (a
token budget of `rows` times the mean sample length). Figures: real tokens trained per second
(median step), the padding share of the padded tensors, the peak resident memory of the steps,
and the largest absolute difference between the two paths' log-probs of the whole batch.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from polyrl.bench import rss

GROUP = 4


def samples(spec: dict[str, Any], vocab: int) -> list[Any]:
    """Groups of GROUP completions, rewards alternating 0 and 1, log-normal lengths."""
    from polyrl.workers.trainer import batching

    rng = random.Random(0)
    out = []
    for group in range(spec["samples"] // GROUP):
        prompt = [rng.randrange(3, vocab) for _ in range(spec["prompt"])]
        for i in range(GROUP):
            length = rng.lognormvariate(math.log(spec["median_completion"]), 1.0)
            n = max(1, min(spec["max_completion"], round(length)))
            completion = [rng.randrange(3, vocab) for _ in range(n)]
            out.append(
                batching.Sample(prompt, completion, [-2.0] * n, float(i % 2), f"g{group}", 0)
            )
    return out


def main(argv: list[str]) -> int:
    import torch

    from polyrl.api.resources import AlgorithmSpec, PolicySpec
    from polyrl.workers.trainer import batching, packing
    from polyrl.workers.trainer.learner import Learner

    spec = json.loads(Path(argv[1]).read_text())
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    lengths_probe = samples(spec, 100)
    mean = statistics.fmean(len(s.prompt_ids) + len(s.completion_ids) for s in lengths_probe)
    trainer: dict[str, Any] = {"batchSize": spec["samples"], "optimizer": {"lr": 1e-5}}
    if spec["mode"] == "packed":
        trainer["microBatchTokens"] = round(spec["rows"] * mean)
    else:
        trainer["microBatchSize"] = spec["rows"]
    policy = PolicySpec.model_validate(
        {"name": "bench", "model": {"path": spec["model"]}, "trainer": trainer}
    )
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-trainer-") as workdir:
        learner = Learner(policy, AlgorithmSpec(group_size=GROUP), workdir=Path(workdir))
        batch = samples(spec, len(learner.tokenizer))
        padded = batching.collate(batch, 0)
        with torch.no_grad():
            args = (padded.input_ids, padded.attention_mask, padded.loss_mask, 1.0)
            diff = (
                packing.packed_logprobs(learner.model, *args)
                - batching.completion_logprobs(learner.model, *args)
            ).abs().max().item()  # fmt: skip
        rss.reset_peak()
        seconds = []
        for _ in range(spec["steps"]):
            started = time.perf_counter()
            learner.step(batch)
            seconds.append(time.perf_counter() - started)
    real = int(padded.attention_mask.sum())
    rows = [batch[i : i + spec["rows"]] for i in range(0, len(batch), spec["rows"])]
    padded_cells = sum(
        len(r) * max(len(s.prompt_ids) + len(s.completion_ids) for s in r) for r in rows
    )
    figures = {
        "tokens": real,
        "step_s": round(statistics.median(seconds), 3),
        "tokens_per_second": round(real / statistics.median(seconds), 1),
        "peak_rss_gb": rss.peak_gb(),
        "padding_share_if_padded": round(1 - real / padded_cells, 3),
        "logprob_max_abs_diff_packed_vs_padded": diff,
    }
    Path(argv[2]).write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
