"""LLM-as-judge: a reward a policy gives, bounded in time, and never silently zero.

A workflow scores an answer by asking a policy (usually a frozen one: `frozen: true`, a
judge or reward model served without a trainer) through the same generation client as any
other request, so rewards still never touch NATS and a slow judge holds only the episode
that waits for it. A verdict fails when the judge does not answer within
`workflow.judge.timeoutSeconds`, when no rollout answers or one refuses the prompt, or when
`verdict` finds no score in its answer. Then the episode is dropped and counted (reason
`judge`), unless the job sets `workflow.judge.fallbackScore`: that score is used instead,
and counted apart (`judge_fallbacks`), never mixed with the scores the judge gave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from polyrl.api.resources import JudgeSpec
from polyrl.api.wire import GenerationResponse
from polyrl.workers.models.prompts import PromptError
from polyrl.workers.workflows.dropped import EpisodeDropped

Verdict = Callable[[str], float | None]
"""A judge's answer (text) to a score, or None where it holds no verdict."""

Ask = Callable[[], Awaitable[GenerationResponse]]


class JudgeFailed(EpisodeDropped):
    """A verdict that failed with no fallback score: the episode is dropped (`judge`)."""

    reason = "judge"


async def verdict_of(
    ask: Ask, text: Callable[[GenerationResponse], str], verdict: Verdict, *, policy: str,
    spec: JudgeSpec,
) -> float | None:  # fmt: skip
    """The judge's score, or None where its verdict failed and the job has a fallback
    score (the caller counts it and uses `spec.fallbackScore`); JudgeFailed otherwise."""
    try:
        response = await asyncio.wait_for(ask(), spec.timeout_seconds)
        answer = text(response)
        score = verdict(answer)
        if score is None:
            raise ValueError(f"no verdict in its answer {answer[:80]!r}")
    except (TimeoutError, EpisodeDropped, PromptError, ValueError) as err:
        why = (
            "no verdict within workflow.judge.timeoutSeconds"
            if isinstance(err, TimeoutError)
            else str(err)
        )
        if spec.fallback_score is None:
            raise JudgeFailed(f"judge {policy!r} failed: {why}", policy=policy) from err
        return None
    return float(score)


__all__ = ["JudgeFailed", "Verdict", "verdict_of"]
