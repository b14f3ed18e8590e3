"""A plain GRPO loop in one process: the yardstick for what the pipeline's RL could reach.

docs/benchmarks.md ("Learning") compares `polyrl run` against this loop on the same model, task
and loss: it warms a tiny Llama up on 2-digit addition to a dev accuracy, then runs GRPO
(`polyrl.workers.trainer.objectives.ppo`, the trainer's default loss) on fresh samples of the torch engine with no
staleness, no NATS and no verifier, and prints held-out greedy accuracy every 10 steps as JSON.

    .venv/bin/python scripts/grpo_single.py --reverse --target 0.2 --lr 1e-3
    .venv/bin/python scripts/grpo_single.py --model quickstart-solver --reverse --target 0.3 \\
        --lr 1e-3 --lr-warmup 10 --kl 0.05

One thread, about 1 s per RL step of 256 samples on this machine, plus the warm-up.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

import safetensors.torch
import torch
from transformers import PreTrainedTokenizerBase

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("operator", "workers")]

from polyrl.api.resources import ModelSource, TaskSpec  # noqa: E402
from polyrl.workers import tasks  # noqa: E402
from polyrl.workers.models import loading as models  # noqa: E402
from polyrl.workers.rollout.engines.base import SamplingParams  # noqa: E402
from polyrl.workers.rollout.engines.torch_engine import TorchEngine  # noqa: E402
from polyrl.workers.trainer import batching, warmup  # noqa: E402
from polyrl.workers.trainer.learner import scheduled_lr  # noqa: E402
from polyrl.workers.trainer.objectives import ppo  # noqa: E402


def parse() -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--model", default="exp-solver", help="tiny-llama:// name (its init)")
    cli.add_argument("--cache", type=Path, default=Path("/tmp/polyrl-grpo-single"))
    cli.add_argument("--reverse", action="store_true", help="answers least significant first")
    cli.add_argument("--target", type=float, default=0.2, help="warm-up dev accuracy to reach")
    cli.add_argument("--warmup-steps", type=int, default=6000, help="warm-up step limit")
    cli.add_argument("--warmup-batch", type=int, default=32)
    cli.add_argument("--check-every", type=int, default=10, help="warm-up steps between checks")
    cli.add_argument("--lr", type=float, default=1e-3)
    cli.add_argument("--lr-warmup", type=int, default=0, help="RL steps of linear lr ramp")
    cli.add_argument("--kl", type=float, default=0.0, help="k3 KL to the warmed-up policy")
    cli.add_argument("--prompts", type=int, default=32)
    cli.add_argument("--group", type=int, default=8)
    cli.add_argument("--temperature", type=float, default=0.6)
    cli.add_argument("--steps", type=int, default=150)
    cli.add_argument("--seed", type=int, default=0, help="warm-up data order and RL sampling")
    cli.add_argument(
        "--init",
        type=Path,
        help="start RL from these weights instead of a warm-up (e.g. a pipeline run's "
        "trainers/.../checkpoint/reference.safetensors, its warm-started policy)",
    )
    return cli.parse_args()


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    params: dict[str, int | float | str | bool] = {"digits": 2, "reverse": args.reverse}
    task = tasks.load_task(TaskSpec(name="arithmetic", params=params))
    source = ModelSource(path=f"tiny-llama://{args.model}", dtype="float32")
    model, tok = models.make_model(source, cache_dir=args.cache)
    dev_rng = random.Random(99)
    if args.init is not None:
        model.load_state_dict(safetensors.torch.load_file(args.init))
        warmed = {"steps": 0.0, "dev_accuracy": float("nan")}
    else:
        warmed = warmup.supervised_warmup(
            model, tok, task, steps=args.warmup_steps, batch_size=args.warmup_batch, lr=3e-3,
            seed=args.seed, target=args.target, dev=[task.sample(dev_rng) for _ in range(200)],
            max_new_tokens=4, check_every=args.check_every,
        )  # fmt: skip
    held = task.held_out()[:500]

    def report(**figures: float) -> None:
        accuracy = warmup.greedy_accuracy(model, tok, held, max_new_tokens=4, reward=task.reward)
        print(json.dumps({**figures, "accuracy": accuracy}), flush=True)

    report(step=0, warmup_steps=warmed["steps"], warmup_dev=warmed["dev_accuracy"])
    reference = copy.deepcopy(model).requires_grad_(False) if args.kl else None
    rollout_model = copy.deepcopy(model)
    torch.nn.Module.to(rollout_model, torch.bfloat16)  # in place; transformers' `to` confuses mypy
    engine = TorchEngine(rollout_model, max_batch_size=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng = random.Random(args.seed + 1)
    sampling = SamplingParams(
        max_new_tokens=4, temperature=args.temperature, stop_token_ids=(tok.eos_token_id,)
    )
    for step in range(args.steps):
        batch, reward = rollouts(task, tok, engine, sampling, args, rng, step)
        model.train()
        new = logprobs(model, batch, args.temperature)
        ref = None
        if reference is not None:
            with torch.no_grad():
                ref = logprobs(reference, batch, args.temperature)
        loss, _ = ppo.decoupled_ppo_loss(
            new, batch.old_logprobs, batch.advantages, batch.loss_mask,
            clip_low=0.2, clip_high=0.28, tis_cap=2.0, prox_logprobs=new.detach(),
            kl_coef=args.kl, ref_logprobs=ref,
        )  # fmt: skip
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = scheduled_lr(step, args.lr, args.lr_warmup)
        optimizer.step()
        engine.load_weights({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
        if (step + 1) % 10 == 0:
            report(step=step + 1, reward=reward)


def rollouts(
    task: tasks.Task,
    tok: PreTrainedTokenizerBase,
    engine: TorchEngine,
    sampling: SamplingParams,
    args: argparse.Namespace,
    rng: random.Random,
    step: int,
) -> tuple[batching.Batch, float]:
    """One batch: `prompts` fresh problems, `group` samples each, rewarded by the task."""
    problems = [task.sample(rng) for _ in range(args.prompts)]
    prompts = [tok(p.prompt)["input_ids"] for p in problems for _ in range(args.group)]
    outputs = engine.generate(prompts, sampling)
    samples = []
    for i, out in enumerate(outputs):
        ids = [t for t in out.tokens if t != tok.eos_token_id]
        text = str(tok.decode(ids, skip_special_tokens=True))
        samples.append(
            batching.Sample(
                prompt_ids=prompts[i], completion_ids=out.tokens,
                behaviour_logprobs=out.logprobs, reward=task.reward(problems[i // args.group], text),
                group_id=str(i // args.group), weight_version=step,
            )
        )  # fmt: skip
    samples = batching.assign_advantages(samples)
    mean = sum(s.reward for s in samples) / len(samples)
    return batching.collate(samples, int(tok.pad_token_id or 0)), mean


def logprobs(model: torch.nn.Module, batch: batching.Batch, temperature: float) -> torch.Tensor:
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return batching.token_logprobs(logits, batch.input_ids, batch.loss_mask, temperature)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
