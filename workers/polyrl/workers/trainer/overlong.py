"""DAPO's treatment of samples cut at the length limit (`algorithm.loss.name: dapo`).

A completion cut at `maxNewTokens` has no answer to reward, so its low reward says "too long"
as much as "wrong". DAPO (Yu et al. 2025, §3.4) filters such samples out of the loss, and
softens the cliff with a penalty that grows linearly over the last `overlongBufferTokens`
before the limit:

    R'(y) = R(y) - penalty * clip((|y| - (L_max - buffer)) / buffer, 0, 1)

|y| is the longest reply of the sample (a run of sampled tokens under its loss mask), since
the limit applies to each generation call of a multi-turn episode, without the end-of-turn
token of a reply that stopped: that token is not content, and counting it would penalise a
well-formed answer that needs the whole budget (a 3-digit sum under `maxNewTokens: 4`) as if
it had been cut. The penalty changes the reward before advantages are computed; the filter
leaves the sample in its group (its reward still shapes its siblings' advantages) and trains
on none of its tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from polyrl.api.objectives import ResolvedLoss
from polyrl.workers.trainer.batching import Sample


def longest_reply(sample: Sample) -> int:
    """The longest run of sampled tokens (the longest single generation), less its end-of-
    turn token where every reply stopped (finish reason "stop")."""
    mask = sample.completion_mask
    best = run = 0
    for sampled in [True] * len(sample.completion_ids) if mask is None else mask:
        run = run + 1 if sampled else 0
        best = max(best, run)
    return best - 1 if sample.finish_reason == "stop" and best > 0 else best


def penalty(length: int, loss: ResolvedLoss) -> float:
    """The soft overlong penalty of a reply of `length` tokens (0 below the buffer)."""
    if loss.overlong_buffer <= 0 or loss.overlong_penalty == 0:
        return 0.0
    start = loss.max_new_tokens - loss.overlong_buffer
    return loss.overlong_penalty * min(1.0, max(0.0, (length - start) / loss.overlong_buffer))


def penalised(samples: Sequence[Sample], loss: ResolvedLoss) -> list[Sample]:
    """The samples with the soft overlong penalty taken off their rewards."""
    return [
        dataclasses.replace(s, reward=s.reward - penalty(longest_reply(s), loss)) for s in samples
    ]


def filtered(samples: Sequence[Sample], loss: ResolvedLoss) -> tuple[list[Sample], int]:
    """The samples with those cut at the limit masked out of the loss; and how many were."""
    if not loss.overlong_filter:
        return list(samples), 0
    out, cut = [], 0
    for s in samples:
        if s.finish_reason == "length":
            s = dataclasses.replace(s, completion_mask=[False] * len(s.completion_ids))
            cut += 1
        out.append(s)
    return out, cut
