"""What every objective shares: its inputs, the masked arithmetic, truncated importance
weights, the k3 KL, aggregation into one loss, and the importance-weight figures.

Alignment as in `polyrl.workers.trainer.batching`: per-token ``[B, T]`` tensors, values where
`mask` is False ignored even when inf or NaN (some engines pad with -inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from polyrl.api.objectives import Aggregation, ResolvedLoss


@dataclass(frozen=True, slots=True)
class Normaliser:
    """The step's trained tokens and sequences that a micro-batch's loss is divided by (over
    the world size under data parallelism, whose all-reduce averages), so micro-batches and
    ranks are not re-weighted against each other. None: this micro-batch's own."""

    tokens: float | None = None
    sequences: float | None = None


@dataclass(frozen=True, slots=True)
class Inputs:
    """One micro-batch's log-probs (masked entries zeroed) and advantages, per token."""

    new: Tensor  # the policy being optimised: carries the gradient
    old: Tensor  # behaviour: the rollout engine's, detached
    prox: Tensor  # the trainer's own before the batch's first update (old if unknown)
    adv: Tensor  # per-token advantages
    valid: Tensor  # bool: trained on


@dataclass(slots=True)
class PerToken:
    """What an objective returns: its per-token loss (0 off the mask), which tokens it clipped
    or masked, and figures of its own (already floats)."""

    loss: Tensor
    clipped: Tensor
    figures: dict[str, float] = field(default_factory=dict)


def inputs(
    new: Tensor,
    old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    prox: Tensor | None,
) -> Inputs:
    """Masked, detached where they must be, advantages broadcast to tokens."""
    for name, tensor in (("old_logprobs", old), ("mask", mask), ("prox_logprobs", prox)):
        if tensor is not None and tensor.shape != new.shape:
            raise ValueError(f"{name} {tuple(tensor.shape)} != new_logprobs {tuple(new.shape)}")
    valid = mask.bool()

    def safe(x: Tensor) -> Tensor:  # masked entries -> 0, so no inf/NaN reaches exp or grads
        return torch.where(valid, x.to(new.dtype), 0.0)

    adv = advantages.detach().to(new.dtype)
    if adv.dim() == 1 and new.dim() == 2:
        adv = adv.unsqueeze(1)
    old_safe = safe(old.detach())
    return Inputs(
        new=safe(new),
        old=old_safe,
        prox=old_safe if prox is None else safe(prox.detach()),
        adv=safe(adv.expand_as(new)),
        valid=valid,
    )


def tis_weights(prox_logprobs: Tensor, old_logprobs: Tensor, *, tis_cap: float) -> Tensor:
    """Truncated importance weights ``min(exp(prox - old), tis_cap)``, with no gradient.

    The rollout engine's policy differs from the trainer's: it may be some versions behind,
    and even at the same version its kernels (and precision) give slightly different
    probabilities. Weighting each token by pi_trainer / pi_rollout corrects the expectation;
    capping the weight bounds the variance a few very unlikely tokens could add. The weight is
    a constant of the step (like the advantage), hence detached.
    """
    with torch.no_grad():
        return (prox_logprobs - old_logprobs).exp().clamp(max=tis_cap)


def k3_kl(new_logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(new || ref): ``exp(ref - new) - (ref - new) - 1``.

    Unbiased for samples drawn from the current policy, always >= 0 (unlike ``new - ref``),
    and with lower variance than ``(new - ref)^2 / 2`` far from the reference (Schulman 2020).
    """
    delta = ref_logprobs - new_logprobs
    return delta.exp() - delta - 1


def sequence_mean(x: Tensor, valid: Tensor) -> Tensor:
    """Each row's mean over its valid tokens, ``[B]`` (0 for a row with none)."""
    counts = valid.sum(dim=-1).clamp(min=1).to(x.dtype)
    return torch.where(valid, x, 0.0).sum(dim=-1) / counts


def aggregate(
    per_token: Tensor, valid: Tensor, loss: ResolvedLoss, normaliser: Normaliser
) -> Tensor:
    """The micro-batch's share of the step's loss, by `loss.aggregation`."""
    rows = valid.any(dim=-1)
    sequences = normaliser.sequences or float(rows.sum().clamp(min=1))
    if loss.aggregation == Aggregation.SEQUENCE_MEAN:
        return sequence_mean(per_token, valid).sum() / sequences
    total = torch.where(valid, per_token, 0.0).sum()
    if loss.aggregation == Aggregation.CONSTANT:
        return total / (sequences * loss.max_new_tokens)
    tokens = normaliser.tokens or float(valid.sum().clamp(min=1))
    return total / tokens


def figures(
    x: Inputs, loss: Tensor, pg: PerToken, kl: Tensor | None, tis_cap: float
) -> dict[str, float]:
    """Token-means over the valid tokens, gathered with one device sync.

    The importance-weight figures are of w = current/behaviour for every objective, so runs
    of different objectives compare: ``is_deviation`` (mean |w - 1|), ``is_m2`` (mean
    (log w)^2, the second moment M2PO bounds) and ``clip_frac`` (tokens the objective clipped
    or masked).
    """
    with torch.no_grad():
        dtype = x.new.dtype
        n = x.valid.sum().clamp(min=1).to(dtype)

        def mean(t: Tensor) -> Tensor:
            return torch.where(x.valid, t.to(dtype), 0.0).sum() / n

        log_w = x.new - x.old
        values = {
            "loss": loss.detach().to(dtype),
            "pg_loss": mean(pg.loss),
            "kl_mean": mean(kl) if kl is not None else torch.zeros_like(n),
            "clip_frac": mean(pg.clipped),
            "ratio_mean": mean((x.new - x.prox).exp()),
            "tis_weight_mean": mean(tis_weights(x.prox, x.old, tis_cap=tis_cap)),
            "tis_truncated_frac": mean(x.prox - x.old > math.log(tis_cap)),
            "is_deviation": mean((log_w.exp() - 1).abs()),
            "is_m2": mean(log_w.square()),
            "entropy_proxy": mean(-x.new),
            "num_tokens": x.valid.sum().to(dtype),
        }
        floats = torch.stack(list(values.values())).tolist()
    return dict(zip(values, floats, strict=True)) | pg.figures
