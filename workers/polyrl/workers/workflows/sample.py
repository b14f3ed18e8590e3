"""What a trainer is sent of one sample: the ids, which of them the policy wrote, and when.

Between a workflow's `Episode.emit` and the Trajectory the runner publishes (its reward added)
a sample is this: a one-turn completion (`Sample.of`), or a conversation of several
(`conversation.Conversation.sample`), whose ids the policy was shown are masked out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from polyrl.api.wire import GenerationResponse


@dataclass(frozen=True, slots=True)
class Sample:
    """What a trainer is sent of one sample, before its reward: the ids the policy was shown
    (`prompt_tokens`), then the ids after them (`tokens`), of which it wrote those in
    `loss_mask` (None: all of them) with their behaviour log-probs (0 where it did not)."""

    prompt_tokens: list[int]
    tokens: list[int]
    logprobs: list[float]
    loss_mask: list[bool] | None
    weight_version: int
    """The weights that wrote it; the oldest of them for a conversation of several turns, so
    that the trainer's staleness bound holds for every turn."""
    finish_reason: Literal["stop", "length"] | None = None
    """"length" if a reply was cut at the length limit, else "stop"."""

    @classmethod
    def of(cls, response: GenerationResponse, index: int) -> Sample:
        """Completion `index` of `response`: every token after the prompt sampled."""
        completion = response.completions[index]
        return cls(
            prompt_tokens=response.prompt_tokens,
            tokens=completion.tokens,
            logprobs=completion.logprobs,
            loss_mask=None,
            weight_version=response.weight_version,
            finish_reason=completion.finish_reason,
        )


__all__ = ["Sample"]
