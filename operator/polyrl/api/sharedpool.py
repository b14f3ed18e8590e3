"""Shared rollout pools (`rollout.servedBy`): what the API server and the spec model refuse.

Kept apart from the resources themselves: one engine serves several policies' adapters on
one base only when they train adapters on the same model (docs/architecture.md, shared
pools), and both checks say so in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyrl.api.lora import LoraSync

if TYPE_CHECKING:
    from polyrl.api.resources import PolicySpec, RLJobSpec

MESSAGE = (
    "rollout.servedBy must name another policy of the job that has no servedBy itself, "
    "and both policies need trainer.lora"
)
# The API server checks names and that both train adapters (presence tests cost little); a
# rule comparing model paths too costs more than CEL's budget allows over 16 policies, so
# the spec model refuses the rest (`check`), which `polyrl run` says before start
# and the operator as the job's condition.
RULE = (
    "self.policies.all(p, !has(p.rollout.servedBy) || (has(p.trainer.lora) && "
    "self.policies.exists(q, q.name == p.rollout.servedBy && q.name != p.name && "
    "!has(q.rollout.servedBy) && has(q.trainer.lora))))"
)


def check(spec: RLJobSpec, policy: PolicySpec, pool: str) -> None:
    """A shared pool serves adapters of one base: refuse what one engine cannot serve."""
    where = f"policy {policy.name}: rollout.servedBy {pool!r}"
    serving = spec.policy(pool)
    if serving is None or serving.name == policy.name:
        raise ValueError(f"{where} is not another policy of the job")
    if serving.rollout.served_by is not None:
        raise ValueError(f"{where} is itself served by {serving.rollout.served_by!r}")
    for p in (policy, serving):
        lora = p.trainer.lora
        if lora is None or lora.sync != LoraSync.ADAPTER:
            raise ValueError(
                f"{where}: a shared pool serves LoRA adapters; policy {p.name} needs "
                "trainer.lora with sync: adapter"
            )
    for field in ("path", "dtype", "tokenizer"):
        mine, theirs = getattr(policy.model, field), getattr(serving.model, field)
        if mine != theirs:
            raise ValueError(
                f"{where}: a shared pool holds one base model; model.{field} is {mine!r} "
                f"here and {theirs!r} in {pool}"
            )
