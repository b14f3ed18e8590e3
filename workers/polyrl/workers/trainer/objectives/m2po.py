"""M2PO (Zheng, Zhao and Chen 2025, "Prosperity before Collapse"): a trust region on the
second moment of the importance weights, for stale samples (AstraFlow's setting).

    r_t  = exp(new_t - old_t)                                  current/behaviour
    T    = {t : (A_t > 0 and r_t > 1) or (A_t < 0 and r_t < 1)}  where a clip would act
    M_t  = 0 for the tokens of T with the largest (log r_t)^2, removed one by one until the
           mean of (log r)^2 over what remains of T is at most m2_threshold; else 1
    pg_t = -M_t * r_t * A_t

No clip: only the extreme outliers are masked, so informative high-entropy tokens that PPO
would clip keep their gradient. The mask is a constant of the update (computed without
gradient), over each micro-batch (over the whole batch when `trainer.microBatchSize` holds
it, as in the paper); masked tokens stay in the token-mean's denominator (the paper's
footnote). Binds from the first update when samples are stale.
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyrl.api.objectives import ResolvedLoss
from polyrl.workers.trainer.objectives.terms import Inputs, PerToken


def trust_region(log_ratio: Tensor, adv: Tensor, valid: Tensor) -> Tensor:
    """T: the valid tokens whose ratio moved the way their advantage pushes."""
    return valid & (((adv > 0) & (log_ratio > 0)) | ((adv < 0) & (log_ratio < 0)))


def second_moment_mask(log_ratio: Tensor, adv: Tensor, valid: Tensor, threshold: float) -> Tensor:
    """True where a token stays: all valid tokens but the largest-(log r)^2 ones of T that
    push T's mean second moment above `threshold`."""
    with torch.no_grad():
        trust = trust_region(log_ratio, adv, valid)
        keep = valid.clone()
        index = trust.flatten().nonzero().squeeze(-1)
        values = log_ratio.flatten()[index].square()
        if values.numel() == 0 or float(values.mean()) <= threshold:
            return keep
        ordered, order = values.sort()
        counts = torch.arange(1, len(ordered) + 1, dtype=ordered.dtype, device=ordered.device)
        kept = int(((ordered.cumsum(0) / counts) <= threshold).sum())
        flat = keep.flatten()
        flat[index[order[kept:]]] = False
        return flat.view_as(valid)


def per_token(x: Inputs, loss: ResolvedLoss) -> PerToken:
    log_ratio = (x.new - x.old).clamp(-20.0, 20.0)
    keep = second_moment_mask(log_ratio.detach(), x.adv, x.valid, loss.m2_threshold)
    pg = torch.where(keep, -log_ratio.exp() * x.adv, 0.0)
    with torch.no_grad():
        kept = keep & trust_region(log_ratio, x.adv, x.valid)
        m2 = float(torch.where(kept, log_ratio.square(), 0.0).sum() / kept.sum().clamp(min=1))
    return PerToken(pg, x.valid & ~keep, {"m2_kept": m2})  # over what stays of T
