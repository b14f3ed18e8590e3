"""Micro-batches by rows or by a token budget, and the packed forward pass.

Padding every micro-batch to its longest sample wastes most of a step when lengths have a
long tail (multi-turn and reasoning traces). With `trainer.microBatchTokens` the trainer
instead fills each micro-batch with samples up to that many tokens and runs them as one row:
the samples end to end, each with position ids from 0 and no attention mask, from which
transformers builds a block-diagonal causal mask (`masking_utils.find_packed_sequence_indices`;
only without a KV cache, hence ``use_cache=False``), so no token attends across a sample
boundary. The log-probs are laid back out as the padded batch's ``[B, L]`` rows, so the
objectives see exactly what the padded path gives them. `tests/unit/workers/test_packing.py`
checks that the log-probs, loss and gradients agree with the padded path in float64 on the
Llama, Qwen2 and Qwen3 test models, which fails if the mask is not in effect.

Every rank runs the same number of micro-batches per step (`balanced`): a rank short of
samples runs zero-weighted passes, so collectives inside the forward (sharded training)
always meet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

Plan = list[list[int]]  # micro-batches, each a list of the rank's batch rows


def by_rows(rows: int, size: int) -> Plan:
    """Consecutive micro-batches of `size` rows."""
    return [list(range(start, min(start + size, rows))) for start in range(0, rows, size)]


def by_tokens(lengths: Sequence[int], budget: int) -> Plan:
    """Consecutive rows while their tokens fit `budget`; a row longer than the budget alone.

    In order rather than sorted, so that a micro-batch's samples are the padded path's
    neighbours and a plan is reproducible from the batch alone."""
    if budget < 1:
        raise ValueError(f"a token budget must be >= 1, got {budget}")
    plan: Plan = []
    used = budget
    for row, length in enumerate(lengths):
        if used + length > budget:
            plan.append([])
            used = 0
        plan[-1].append(row)
        used += length
    return plan


def balanced(plans: Sequence[Plan]) -> list[Plan]:
    """Every rank's plan, padded with empty micro-batches to the longest one's count."""
    most = max((len(p) for p in plans), default=0)
    return [list(p) + [[] for _ in range(most - len(p))] for p in plans]


def packed_logprobs(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    temperature: float,
) -> Tensor:
    """`batching.completion_logprobs` of right-padded rows, computed as one packed row.

    Logits are computed only at the positions that predict a trained token (a 1-D
    `logits_to_keep`), as the padded path keeps only the columns from the first completion.
    """
    real = attention_mask.bool()
    if bool((loss_mask.bool() & ~real).any()) or bool(loss_mask[:, 0].any()):
        raise ValueError("loss_mask covers padding or position 0 (no preceding logits)")
    rows, cols = real.nonzero(as_tuple=True)  # row-major: the samples end to end
    ids = input_ids[rows, cols].unsqueeze(0)
    positions = cols.unsqueeze(0)  # from 0 in every sample: the packed-sequence signal
    targets = loss_mask.bool()[rows, cols].nonzero().squeeze(-1)
    dtype = torch.float32
    if targets.numel() == 0:
        return torch.zeros(loss_mask.shape, dtype=dtype, device=loss_mask.device)
    logits = model(
        input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=targets - 1
    ).logits[0]
    logits = logits.to(torch.promote_types(logits.dtype, dtype)) / temperature
    picked = logits.gather(-1, ids[0, targets].unsqueeze(-1)).squeeze(-1)
    values = picked - torch.logsumexp(logits, dim=-1)
    out = torch.zeros(loss_mask.shape, dtype=values.dtype, device=values.device)
    return out.index_put((rows[targets], cols[targets]), values)


def idle_forward(model: Any, pad_id: int) -> torch.Tensor:
    """A forward on two pad tokens, its logits: with a zero-weighted backward, the pass of a
    rank with no micro-batch left, which meets the others' collectives and adds nothing to
    any gradient (`Learner._idle_pass`)."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=_device(model))
    logits: torch.Tensor = model(input_ids=ids, use_cache=False).logits
    return logits


def _device(model: Any) -> torch.device:
    device: torch.device = next(iter(model.parameters())).device
    return device
