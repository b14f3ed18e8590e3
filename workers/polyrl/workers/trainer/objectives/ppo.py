"""Decoupled PPO with truncated importance sampling: `grpo` (and `dapo`, which adds only the
overlong treatment of its samples, `overlong`).

    r_t  = exp(new_t - prox_t)                       current/proximal, clipped
    w_t  = min(exp(prox_t - old_t), tis_cap)         proximal/behaviour, truncated, detached
    pg_t = -w_t * min(r_t * A_t, clip(r_t, 1 - clip_low, 1 + clip_high) * A_t)

- The clip is PPO's pessimistic ``min``: a token whose ratio already moved past the bound in
  the direction its advantage pushes gets no gradient, which bounds the step. The upper
  bound is looser than the lower (DAPO's clip-higher) so that low-probability tokens with
  positive advantage can still grow, which keeps entropy from collapsing.
- ``prox`` is the trainer's own log-probs before the batch's first update (decoupled PPO,
  Hilton et al. 2022; AReaL): the trust region is measured against the policy being
  optimised, not the stale or numerically different rollout policy. So r = 1 at the first
  update: the clip binds from a batch's second optimizer step (`trainer.miniBatches`,
  `trainer.updatesPerBatch`).
- ``w`` corrects for sampling from the behaviour policy (truncated IS, binds at once); it
  does not multiply the KL term, a regulariser whose strength should not depend on how far
  the rollouts drifted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.api.objectives import Aggregation, LossName, ResolvedLoss
from polyrl.workers.trainer.objectives.terms import Inputs, Normaliser, PerToken, tis_weights


def per_token(x: Inputs, loss: ResolvedLoss) -> PerToken:
    ratio = (x.new - x.prox).exp()
    weight = tis_weights(x.prox, x.old, tis_cap=loss.tis_cap)
    clipped = ratio.clamp(1 - loss.clip_low, 1 + loss.clip_high)
    pg = -weight * torch.minimum(ratio * x.adv, clipped * x.adv)
    high = (x.adv > 0) & (ratio > 1 + loss.clip_high)
    low = (x.adv < 0) & (ratio < 1 - loss.clip_low)
    return PerToken(pg, high | low)


def decoupled_ppo_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    tis_cap: float,
    kl_coef: float = 0.0,
    ref_logprobs: Tensor | None = None,
    prox_logprobs: Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """`grpo` token-mean with these settings: for scripts and tests that name them directly.

    Returns the scalar loss and `terms.figures`.
    """
    from polyrl.workers.trainer.objectives import policy_loss  # the dispatcher imports us

    settings = ResolvedLoss(
        name=LossName.GRPO,
        clip_low=clip_low,
        clip_high=clip_high,
        tis_cap=tis_cap,
        aggregation=Aggregation.TOKEN_MEAN,
        advantage_std=True,
        m2_threshold=0.04,
        max_new_tokens=1,
        overlong_filter=False,
        overlong_buffer=0,
        overlong_penalty=0.0,
    )
    return policy_loss(
        new_logprobs,
        old_logprobs,
        advantages,
        mask,
        loss=settings,
        prox=prox_logprobs,
        ref=ref_logprobs,
        kl_coef=kl_coef,
        normaliser=Normaliser(tokens=num_tokens),
    )
