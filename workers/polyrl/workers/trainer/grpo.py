"""GRPO's data side: group advantages and the staleness bound on a batch's samples.

Pure functions of tensors and samples (no model, no transport). The loss itself is one of the
objectives in `polyrl.workers.trainer.objectives` (`algorithm.loss`); today's default, `grpo`,
is decoupled PPO with truncated importance sampling (`objectives.ppo`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor

from polyrl.workers.trainer.intake import Versioned
from polyrl.workers.trainer.intake import filter_stale as filter_stale

__all__ = [
    "age_histogram",
    "age_quantile",
    "filter_stale",
    "group_advantages",
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
