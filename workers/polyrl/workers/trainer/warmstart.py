"""The supervised warm start before RL, for whichever policy its workflow gives examples.

GRPO learns from differences between a group's rewards, so a fresh policy that is never
right learns nothing; a short supervised warm-up on the policy's warm-up examples
(`workflows.interface.PolicyRole.warmup`: the task's answers for a solver, worked verdicts for a verifier)
gets it to where some samples are. It runs once, before version 0: never for a trainer that
resumed from a checkpoint. With `trainer.warmupTargetAccuracy` it stops early once greedy
accuracy on dev problems (drawn from the examples' own distribution, never the held-out
split) reaches the target.
"""

from __future__ import annotations

import random

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from polyrl.api.resources import PolicySpec
from polyrl.workers.tasks import base
from polyrl.workers.trainer import warmup

# Decoupled weight decay (AdamW) shortens the plateau before a tiny model's accuracy takes off,
# as it does for grokking. Measured on `quickstart-solver`, 2-digit addition, batch 32, to the
# quick start's 40 % target: 1,650 / 1,130 steps at 0.1 against 2,420 / 1,830 without (two data
# orders); reversed answers, batch 128, to 20 %: 670 steps, where without it 1,500 were not enough.
WARMUP_WEIGHT_DECAY = 0.1
DEV_PROBLEMS = 200


def dev_problems(examples: base.Task, seed: int, count: int = DEV_PROBLEMS) -> list[base.Problem]:
    """`count` problems of the warm-up's own distribution (drawn from seed + 1, the same for
    every trainer of the job), on which a warm-up measures its target."""
    rng = random.Random(seed + 1)
    return [examples.sample(rng) for _ in range(count)]


def will_run(policy: PolicySpec, examples: base.Task | None, *, resumed: bool) -> bool:
    return examples is not None and policy.trainer.warmup_steps > 0 and not resumed


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    policy: PolicySpec,
    examples: base.Task | None,
    *,
    seed: int,
    max_new_tokens: int,
    resumed: bool,
) -> dict[str, float]:
    """Warm `model` up on `examples` as `policy.trainer` says; its figures ({} if it did not
    run: no examples, no steps, or a resumed trainer)."""
    if examples is None or not will_run(policy, examples, resumed=resumed):
        return {}
    trainer = policy.trainer
    return warmup.supervised_warmup(
        model,
        tokenizer,
        examples,
        steps=trainer.warmup_steps,
        batch_size=trainer.warmup_batch_size,
        lr=trainer.warmup_lr,  # default measured on the tiny model (150 steps: 0 to ~0.9)
        weight_decay=WARMUP_WEIGHT_DECAY,
        seed=seed,
        target=trainer.warmup_target_accuracy,
        dev=dev_problems(examples, seed),
        max_new_tokens=max_new_tokens,
    )


def prefixed(figures: dict[str, float], prefix: str = "warmup_") -> dict[str, float]:
    return {f"{prefix}{k}": v for k, v in figures.items()}
