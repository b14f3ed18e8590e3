"""The policy-gradient objectives (`algorithm.loss`), one module each behind one signature:
``per_token(inputs, settings) -> PerToken``; `policy_loss` adds the KL term, aggregates and
reports. docs/algorithms.md gives each formula with its paper.

Which ratio each clips or masks, and whether that binds at one update per batch:

=========  =========================================  ===============================
objective  clipped or masked                          binds at one update per batch
=========  =========================================  ===============================
grpo       current/proximal, token (+ TIS on          no (TIS: yes)
           proximal/behaviour)
dapo       as grpo; overlong samples filtered         no (TIS: yes)
gspo       current/proximal, sequence (+ sequence     no (TIS: yes)
           TIS on proximal/behaviour)
cispo      current/behaviour weight, token, clipped   yes
m2po       current/behaviour, token, masked by M2     yes, when samples are stale
=========  =========================================  ===============================
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from polyrl.api.objectives import LossName, ResolvedLoss
from polyrl.workers.trainer.objectives import cispo, gspo, m2po, ppo
from polyrl.workers.trainer.objectives.terms import (
    Inputs,
    Normaliser,
    PerToken,
    aggregate,
    figures,
    inputs,
    k3_kl,
)

OBJECTIVES: dict[LossName, Callable[[Inputs, ResolvedLoss], PerToken]] = {
    LossName.GRPO: ppo.per_token,
    LossName.DAPO: ppo.per_token,
    LossName.GSPO: gspo.per_token,
    LossName.CISPO: cispo.per_token,
    LossName.M2PO: m2po.per_token,
}


def policy_loss(
    new: Tensor,
    old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss: ResolvedLoss,
    prox: Tensor | None = None,
    ref: Tensor | None = None,
    kl_coef: float = 0.0,
    normaliser: Normaliser | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The loss to minimise for one micro-batch, and its figures (`terms.figures`).

    `new` carries the gradient; `old` (behaviour), `prox` (the trainer's own before the
    batch's first update; `old` when None), `ref` (the KL anchor) and `advantages` (``[B]``
    or ``[B, T]``) are constants. ``kl_coef * k3(new, ref)`` joins each token's loss when
    `kl_coef` > 0; with `ref` given and no coefficient the KL is only reported.
    """
    if kl_coef > 0 and ref is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if not 0 <= loss.clip_low <= 1 or loss.clip_high < 0:
        raise ValueError(
            f"need 0 <= clip_low <= 1 and clip_high >= 0: {loss.clip_low}, {loss.clip_high}"
        )
    if loss.tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {loss.tis_cap}")
    norm = normaliser or Normaliser()
    for name, value in (("num_tokens", norm.tokens), ("sequences", norm.sequences)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    x = inputs(new, old, advantages, mask, prox)
    if ref is not None and ref.shape != new.shape:
        raise ValueError(f"ref_logprobs {tuple(ref.shape)} != new_logprobs {tuple(new.shape)}")
    pg = OBJECTIVES[loss.name](x, loss)
    kl = k3_kl(x.new, _safe(ref, x)) if ref is not None else None
    per_token = pg.loss if kl is None or kl_coef == 0 else pg.loss + kl_coef * kl
    total = aggregate(per_token, x.valid, loss, norm)
    return total, figures(x, total, pg, kl, loss.tis_cap)


def _safe(ref: Tensor, x: Inputs) -> Tensor:
    return ref.detach().to(x.new.dtype).where(x.valid, 0.0)


__all__ = ["OBJECTIVES", "Normaliser", "policy_loss"]
