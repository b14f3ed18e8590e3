"""CISPO (MiniMax-M1, 2025): clip the importance-sampling weight, never the gradient.

    r_t  = exp(new_t - old_t)                                  current/behaviour
    pg_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A_t * new_t

PPO's clip drops the gradient of a token whose ratio left the trust region; in long reasoning
those are often the rare "fork" tokens that matter. CISPO keeps every token's REINFORCE
gradient and bounds only its weight (default: no lower bound, clip_low 1; 1.28 above). The
weight is current/behaviour, so it corrects staleness itself (no separate TIS) and binds from
the first update.
"""

from __future__ import annotations

from polyrl.api.objectives import ResolvedLoss
from polyrl.workers.trainer.objectives.terms import Inputs, PerToken


def per_token(x: Inputs, loss: ResolvedLoss) -> PerToken:
    ratio = (x.new - x.old).detach().clamp(-20.0, 20.0).exp()
    weight = ratio.clamp(1 - loss.clip_low, 1 + loss.clip_high)
    pg = -weight * x.adv * x.new
    clipped = (ratio > 1 + loss.clip_high) | (ratio < 1 - loss.clip_low)
    return PerToken(pg, clipped)
