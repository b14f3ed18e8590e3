"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the ratio and its clip at
the level of the sequence, where the reward is.

    s_i   = exp(mean_t (new_it - prox_it))              current/proximal, per sequence
    s_it  = sg(s_i) * exp(new_it - sg(new_it))          GSPO-token: value s_i, gradient
                                                        s_i * grad new_it
    w_i   = min(exp(mean_t (prox_it - old_it)), cap)    proximal/behaviour, per sequence
    pg_it = -w_i * min(s_it * A_it, clip(s_it, 1 - clip_low, 1 + clip_high) * A_it)

With the default aggregation (seq-mean-token-mean) and one advantage per sequence this is
exactly GSPO's sequence objective ``-mean_i min(s_i A_i, clip(s_i) A_i)``: a token's gradient
is its sequence's ``s_i A_i / |y_i|``. The geometric mean keeps the ratio's scale independent
of length, which is why its clip range is ~1e-3 of PPO's (defaults 3e-4 / 4e-4). The mean runs
over the sampled tokens only (a multi-turn sample's shown tokens are off the mask). Like PPO's
clip it binds from a batch's second optimizer step; w binds at once.
"""

from __future__ import annotations

import torch

from polyrl.api.objectives import ResolvedLoss
from polyrl.workers.trainer.objectives.terms import Inputs, PerToken, sequence_mean


def per_token(x: Inputs, loss: ResolvedLoss) -> PerToken:
    log_s = sequence_mean(x.new - x.prox, x.valid).detach().unsqueeze(-1)
    ratio = (log_s + x.new - x.new.detach()).exp()
    with torch.no_grad():
        log_w = sequence_mean(x.prox - x.old, x.valid).unsqueeze(-1)
        weight = log_w.exp().clamp(max=loss.tis_cap)
    clipped = ratio.clamp(1 - loss.clip_low, 1 + loss.clip_high)
    pg = -weight * torch.minimum(ratio * x.adv, clipped * x.adv)
    high = (x.adv > 0) & (ratio > 1 + loss.clip_high)
    low = (x.adv < 0) & (ratio < 1 - loss.clip_low)
    return PerToken(pg, high | low)
