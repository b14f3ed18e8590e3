"""The math of one GRPO step: group advantages, staleness filtering and the clipped loss.

Everything here is a pure function of tensors (no model, no transport), so the trainer can
be tested piece by piece and so the exact objective is written down in one place. Settings
come from `polyrl.api.resources.AlgorithmSpec`: ``group_size`` (how workflow runners form
groups), ``clip_low``/``clip_high``, ``kl_coef``, ``max_staleness``, ``tis_cap`` and
``temperature`` (used by `polyrl.workers.trainer.batching.token_logprobs`).

The loss, token-level and averaged over the valid tokens of the batch, is

    r_t   = exp(new_t - prox_t)                      (prox = the trainer's log-probs at the
                                                      start of the step; old if not given)
    w_t   = min(exp(prox_t - old_t), tis_cap)         (old = behaviour log-probs; detached)
    pg_t  = -w_t * min(r_t * A_t, clip(r_t, 1 - clip_low, 1 + clip_high) * A_t)
    kl_t  = exp(ref_t - new_t) - (ref_t - new_t) - 1 (k3 estimator of KL(new || ref))
    loss  = sum_t mask_t * (pg_t + kl_coef * kl_t) / sum_t mask_t

See `grpo_loss` for why each piece is there.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol, TypeVar

import torch
from torch import Tensor

__all__ = [
    "age_histogram",
    "age_quantile",
    "filter_stale",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "tis_weights",
]


# --- advantages -------------------------------------------------------------------------------


def _group_index(group_ids: Sequence[str], device: torch.device) -> tuple[Tensor, int]:
    """Dense integer codes for the group ids, in order of first appearance."""
    codes: dict[str, int] = {}
    index = [codes.setdefault(g, len(codes)) for g in group_ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(codes)


def group_advantages(
    rewards: Tensor, group_ids: Sequence[str], *, eps: float = 1e-6, normalize_std: bool = True
) -> Tensor:
    """GRPO advantages: each reward minus its group's mean, optionally over the group's std.

    The group mean is the baseline GRPO uses instead of a learned critic: samples of the same
    prompt that did better than their siblings are pushed up, worse ones down, so the
    advantages of a group sum to zero. Dividing by the group's (population) std + `eps` makes
    the step size independent of the reward scale of each prompt; `normalize_std=False` keeps
    raw differences (Dr. GRPO argues the division over-weights nearly-solved prompts).

    A group whose rewards are all exactly equal carries no signal about which completion is
    better, so its advantages are exactly zero (not rounding noise from the subtraction).
    Groups need not be contiguous. Computed in float64; returned in `rewards`' float dtype
    (float32 for integer rewards). Raises ValueError on a length mismatch or a non-finite reward.
    """
    if rewards.dim() != 1 or rewards.numel() != len(group_ids):
        raise ValueError(f"{tuple(rewards.shape)} rewards for {len(group_ids)} group ids")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    index, n_groups = _group_index(group_ids, rewards.device)
    r = rewards.to(torch.float64)
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=r.device)
    count = zeros.index_add(0, index, torch.ones_like(r))
    centred = r - (zeros.index_add(0, index, r) / count)[index]
    high = zeros.scatter_reduce(0, index, r, "amax", include_self=False)
    low = zeros.scatter_reduce(0, index, r, "amin", include_self=False)
    if normalize_std:
        std = (zeros.index_add(0, index, centred.square()) / count).sqrt()
        centred = centred / (std[index] + eps)
    flat = (high == low)[index]
    return torch.where(flat, torch.zeros_like(centred), centred).to(out_dtype)


# --- staleness --------------------------------------------------------------------------------


class Versioned(Protocol):
    """Anything stamped with the weight version of the policy that generated it."""

    @property
    def weight_version(self) -> int: ...


V = TypeVar("V", bound=Versioned)


def filter_stale(
    samples: Iterable[V], *, current_version: int, max_staleness: int
) -> tuple[list[V], int]:
    """Keep samples at most `max_staleness` weight versions behind; return (kept, dropped count).

    Truncated importance sampling corrects moderate policy lag, but the further the behaviour
    policy is from the current one the more weights hit the cap and the noisier (and more
    biased) the gradient gets; bounding the age keeps asynchronous training close to on-policy.
    ``max_staleness=0`` is fully on-policy. A sample from a version newer than the trainer's
    (which should not happen) has age <= 0 and is kept. Order is preserved.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    kept: list[V] = []
    dropped = 0
    for sample in samples:
        if current_version - sample.weight_version <= max_staleness:
            kept.append(sample)
        else:
            dropped += 1
    return kept, dropped


def age_histogram(samples: Iterable[Versioned], *, current_version: int) -> dict[int, int]:
    """Count samples by age (current_version - weight_version, floored at 0), ages ascending.

    For the staleness metric: how far behind the rollouts run tells whether `max_staleness`
    is dropping much data or whether the rollout fleet keeps up.
    """
    ages = Counter(max(0, current_version - s.weight_version) for s in samples)
    return dict(sorted(ages.items()))


def age_quantile(ages: Mapping[int, int], q: float) -> float:
    """The `q` quantile (0..1) of an age histogram, nearest rank: the staleness p50 and p95
    shown in status, read from one batch's histogram without keeping its samples."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    total = sum(ages.values())
    if total == 0:
        raise ValueError("no samples")
    rank = max(1, math.ceil(q * total))
    seen = 0
    for age, count in sorted(ages.items()):
        seen += count
        if seen >= rank:
            return float(age)
    raise AssertionError("unreachable: the ranks cover the histogram")


# --- loss -------------------------------------------------------------------------------------


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


def _check_args(
    new: Tensor, others: Mapping[str, Tensor | None], clip_low: float, clip_high: float, cap: float
) -> None:
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != new.shape:
            raise ValueError(f"{name} {tuple(tensor.shape)} != new_logprobs {tuple(new.shape)}")
    if not 0 <= clip_low <= 1 or clip_high < 0:
        raise ValueError(f"need 0 <= clip_low <= 1 and clip_high >= 0: {clip_low}, {clip_high}")
    if cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {cap}")


def _per_token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Per-sequence ``[B]`` advantages broadcast over tokens, or per-token ``[B, T]`` as given."""
    adv = advantages.detach().to(like.dtype)
    if adv.dim() == 1 and like.dim() == 2:
        adv = adv.unsqueeze(1)
    return adv.expand_as(like)


def grpo_loss(
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
    """GRPO loss (to minimise) with asymmetric PPO clipping, truncated IS and optional k3 KL.

    Arguments are per-token ``[B, T]`` in the alignment of `polyrl.workers.trainer.batching`
    (`advantages` may also be per-sequence ``[B]``). `new_logprobs` carries the gradient;
    every other input is treated as a constant. Values where `mask` is False are ignored, even
    if they are inf or NaN (some engines pad with -inf).

    - Ratio ``r = exp(new - prox)`` clipped to ``[1 - clip_low, 1 + clip_high]``, PPO's
      pessimistic ``min``: a token whose ratio already moved past the clip bound in the
      direction its advantage pushes gets no gradient, which bounds the step. The upper bound
      is looser than the lower (DAPO's clip-higher) so low-probability tokens with positive
      advantage can still grow, which keeps entropy from collapsing.
    - ``prox`` is the trainer's own log-probs at the start of the step (decoupled PPO): the
      trust region is measured against the policy being optimised, not the stale or
      numerically different rollout policy. Without it, ``prox = old`` and ``w = 1``.
    - ``w = min(exp(prox - old), tis_cap)``, detached, multiplies the policy-gradient term of
      each token: truncated importance sampling from the behaviour (rollout) policy to the
      trainer's (see `tis_weights`). It does not multiply the KL term, a regulariser whose
      strength should not depend on how far the rollouts drifted.
    - ``kl_coef * k3(new, ref)`` per token when `kl_coef` > 0 (`ref_logprobs` required).
      With ``kl_coef == 0`` and `ref_logprobs` given, the KL is only reported.
    - Token-mean: per-token losses are summed over valid tokens and divided by their number,
      not averaged per sequence first. A sequence-mean gives each token of a long completion
      less weight than one of a short completion, which biases towards length (long wrong
      answers are under-penalised) and dilutes the signal of long reasoning; token-mean
      (DAPO, Dr. GRPO) weighs every generated token alike. With gradient accumulation or data
      parallelism pass `num_tokens` (the step's total valid tokens; divided by the world size
      under DDP, which averages gradients over ranks) so micro-batches are not re-weighted.

    Returns the scalar loss and float stats over the valid tokens: ``loss``, ``pg_loss``,
    ``kl_mean``, ``clip_frac`` (tokens whose gradient the clip removed), ``ratio_mean``,
    ``tis_weight_mean``, ``tis_truncated_frac`` (weights that hit the cap), ``entropy_proxy``
    (mean ``-new`` of the sampled tokens: a one-sample entropy estimate, free to compute) and
    ``num_tokens``.
    """
    others: dict[str, Tensor | None] = {"old_logprobs": old_logprobs, "mask": mask}
    others |= {"ref_logprobs": ref_logprobs, "prox_logprobs": prox_logprobs}
    _check_args(new_logprobs, others, clip_low, clip_high, tis_cap)
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if num_tokens is not None and num_tokens <= 0:
        raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
    valid = mask.bool()

    def safe(x: Tensor) -> Tensor:  # masked entries -> 0, so no inf/NaN reaches exp or grads
        return torch.where(valid, x.to(new_logprobs.dtype), 0.0)

    new = safe(new_logprobs)
    old = safe(old_logprobs.detach())
    prox = old if prox_logprobs is None else safe(prox_logprobs.detach())
    adv = safe(_per_token_advantages(advantages, new_logprobs))
    ratio = (new - prox).exp()
    weight = tis_weights(prox, old, tis_cap=tis_cap)
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    pg = -weight * torch.minimum(ratio * adv, clipped * adv)
    kl = k3_kl(new, safe(ref_logprobs.detach())) if ref_logprobs is not None else None
    per_token = pg if kl is None or kl_coef == 0 else pg + kl_coef * kl
    total = torch.where(valid, per_token, 0.0).sum()
    loss = total / (valid.sum().clamp(min=1) if num_tokens is None else num_tokens)
    terms = _Terms(new, ratio, adv, weight, prox - old, pg, kl)
    return loss, _stats(valid, loss, terms, clip_low, clip_high, tis_cap)


class _Terms(NamedTuple):
    """Intermediate per-token tensors of `grpo_loss`, kept for the stats."""

    new: Tensor
    ratio: Tensor
    adv: Tensor
    weight: Tensor
    log_weight: Tensor  # prox - old, before the cap
    pg: Tensor
    kl: Tensor | None


def _stats(
    valid: Tensor, loss: Tensor, t: _Terms, clip_low: float, clip_high: float, tis_cap: float
) -> dict[str, float]:
    """Token-means over the valid tokens, gathered with a single device sync."""
    with torch.no_grad():
        dtype = t.ratio.dtype
        n = valid.sum().clamp(min=1).to(dtype)
        high = (t.adv > 0) & (t.ratio > 1 + clip_high)
        low = (t.adv < 0) & (t.ratio < 1 - clip_low)

        def mean(x: Tensor) -> Tensor:
            return torch.where(valid, x.to(dtype), 0.0).sum() / n

        values = {
            "loss": loss.detach().to(dtype),
            "pg_loss": mean(t.pg),
            "kl_mean": mean(t.kl) if t.kl is not None else torch.zeros_like(n),
            "clip_frac": mean(high | low),
            "ratio_mean": mean(t.ratio),
            "tis_weight_mean": mean(t.weight),
            "tis_truncated_frac": mean(t.log_weight > math.log(tis_cap)),
            "entropy_proxy": mean(-t.new),
            "num_tokens": valid.sum().to(dtype),
        }
        floats = torch.stack(list(values.values())).tolist()
    return dict(zip(values, floats, strict=True))
