"""What a sharded trainer's ranks run together before RL (`trainer.strategy: fsdp2`).

A data-parallel trainer's rank 0 warms up and prepares its evaluation alone, on its whole
model, then hands every rank its weights. A sharded model holds 1/N of the weights on each
rank, and each forward gathers them from all: rank 0 cannot compute alone. So the model is
sharded first, and then every rank runs the same phases on the same inputs, in step: the
supervised warm-up (the same batches on every rank: the same step one rank would take, and
the same decisions about when to decode its dev problems) and the evaluation's preparation
(the solver's exam answers, decoded greedily: the same tokens, so the same number of
forward passes); after a warm-up the KL anchor becomes the warmed weights, as it is when
rank 0 warms up alone before it is frozen. Only rank 0 talks to NATS: the other ranks' handoff publishes nothing and
fetches nothing (`Silent`). The evaluation before the warm-up, which decodes a workflow's
held-out problems (tools included), is not run: a tool's timing could differ between ranks.
"""

from __future__ import annotations

import asyncio

from polyrl.api.resources import RLJobSpec
from polyrl.workers.models import prompts
from polyrl.workers.trainer import warmstart
from polyrl.workers.trainer.learner import Learner
from polyrl.workers.trainer.scoring import ModelScorer
from polyrl.workers.workflows import interface as roles


def model_scorer(trainer: Learner, role: roles.PolicyRole, spec: RLJobSpec) -> ModelScorer:
    """The trainer's own decoding, as the policy's prompts and budgets say."""
    return ModelScorer(
        trainer.model,
        prompts.for_training(trainer.tokenizer, trainer.policy.model.prompt_format),
        roles.budget(role, spec, trainer.policy),
        spec.algorithm.max_new_tokens,
    )


class Silent:
    """`workflows.interface.Handoff` of a rank that does not talk to NATS."""

    async def publish(self, name: str, data: bytes) -> None:
        return None

    async def fetch(self, policy: str, name: str, *, timeout: float) -> bytes | None:
        return None


def resumed(trainer: Learner) -> bool:
    return trainer.state.step > 0 or trainer.state.epoch > 0


def follow(trainer: Learner, role: roles.PolicyRole, spec: RLJobSpec) -> None:
    """A rank other than 0, on rank 0's order (`ranks.Order.PREPARE`): the warm-up and the
    evaluation's preparation, as rank 0 runs them (`leader.Leader.warm_up_and_evaluate`)."""
    scorer = model_scorer(trainer, role, spec)
    warmed = warmstart.warm_start(
        trainer.model,
        scorer.tokenizer,
        trainer.policy,
        role.warmup,
        seed=spec.workflow.task.seed,
        max_new_tokens=scorer.max_new_tokens,
        resumed=resumed(trainer),
    )
    if warmed:
        trainer.anchor_here()
    if role.evaluator is not None:
        first = trainer.state.step == 0
        asyncio.run(role.evaluator.prepare(Silent(), scorer, first=first))
