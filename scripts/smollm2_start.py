"""Where a job's model starts on its held-out problems: greedy accuracy and sampled pass@k.

Reads an RLJob (by default examples/smollm2-arithmetic.yaml), builds its task as the workers
do (same seed, same held-out split), loads the first policy's model (a GGUF file converted
once into the model cache, as `polyrl run` does) and answers every held-out problem with the
torch engine: greedily, and `--samples` times at the job's temperature. Scored by the task's
own reward. This is how a job's task settings (operand range, prompt format, answer budget)
are chosen before any RL: greedy should leave room to learn, and pass@k says how often
sampling finds a right answer for GRPO to reinforce.

    python scripts/smollm2_start.py                       # the shipped example, k = 8
    python scripts/smollm2_start.py JOB.yaml --samples 4 --threads 2

Prints one JSON object. About 5 minutes on 2 cores for the example (200 problems).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from polyrl.local import jobfile
from polyrl.workers import tasks
from polyrl.workers.models import loading, prompts
from polyrl.workers.models.catalog import cache_dir
from polyrl.workers.rollout.engines.base import SamplingParams
from polyrl.workers.rollout.engines.torch_engine import TorchEngine

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2-arithmetic.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", nargs="?", type=Path, default=EXAMPLE)
    parser.add_argument("--samples", type=int, default=8, help="k of pass@k (default 8)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = jobfile.load(args.job).spec
    policy, algorithm = spec.policies[0], spec.algorithm
    task = tasks.load_task(spec.workflow.task)
    problems = task.held_out()
    directory, _ = loading.local_dirs(policy.model, cache_dir=cache_dir())
    model, tokenizer = loading.load_directory(directory, dtype=torch.bfloat16)
    encode = prompts.for_training(tokenizer, policy.model.prompt_format)
    ids = [prompts.ids_for(encode, p.request) for p in problems]
    engine = TorchEngine(model, max_batch_size=policy.rollout.max_batch_size)
    stops = (int(tokenizer.eos_token_id),)

    def decoded(tokens: list[int]) -> str:
        return str(tokenizer.decode(tokens, skip_special_tokens=True))

    started = time.monotonic()
    budget = algorithm.max_new_tokens
    greedy = engine.generate(
        ids, SamplingParams(max_new_tokens=budget, temperature=0.0, stop_token_ids=stops)
    )
    k = args.samples
    sampled = engine.generate(
        [x for x in ids for _ in range(k)],
        SamplingParams(
            max_new_tokens=budget, temperature=algorithm.temperature, stop_token_ids=stops
        ),
    )
    text = [decoded(g.tokens) for g in sampled]
    right = [
        [task.reward(p, t) >= 1.0 for t in text[i * k : (i + 1) * k]]
        for i, p in enumerate(problems)
    ]
    greedy_right = [
        task.reward(p, decoded(g.tokens)) >= 1.0 for p, g in zip(problems, greedy, strict=True)
    ]
    print(json.dumps({
        "job": str(args.job), "model": policy.model.path, "problems": len(problems),
        "max_new_tokens": algorithm.max_new_tokens, "temperature": algorithm.temperature,
        "greedy": sum(greedy_right) / len(problems),
        f"pass_at_{k}": sum(any(r) for r in right) / len(problems),
        "pass_at_1": sum(map(sum, right)) / (k * len(problems)),
        "seconds": round(time.monotonic() - started, 1),
        "greedy_examples": [
            [p.prompt, decoded(g.tokens)]
            for p, g in list(zip(problems, greedy, strict=True))[:5]
        ],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
