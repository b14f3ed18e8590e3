"""LLM-as-judge (`Episode.judge`): a verdict is a score, a failed one drops the episode
(reason `judge`) or, where the job sets one, gives the fallback score counted apart; a slow
judge holds only its own episode; a frozen policy takes no samples."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from polyrl.api.resources import RLJobSpec
from polyrl.api.wire import Completion, GenerationResponse
from polyrl.workers.workflows import Episode
from polyrl.workers.workflows.dropped import EpisodeDropped
from polyrl.workers.workflows.judge import JudgeFailed


def spec(**judge: Any) -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "policies": [
                {"name": "solver", "model": {"path": "tiny-llama://s"}},
                {"name": "judge", "model": {"path": "tiny-llama://j"}, "frozen": True},
            ],
            "workflow": {"judge": {"timeoutSeconds": 0.2, **judge}},
        }
    )


def answer(text: str) -> GenerationResponse:
    completion = Completion(tokens=[1], logprobs=[-0.1], text=text, finish_reason="stop")
    return GenerationResponse(
        id="r", pod="p", weight_version=0, prompt_tokens=[1], completions=[completion]
    )


def episode(
    job: RLJobSpec, reply: Any, emitted: list[str] | None = None, asked: list[Any] | None = None
) -> Episode:
    async def generate(
        policy: str, prompt: Any, n: int, budget: int, *, temperature: float | None = None
    ) -> GenerationResponse:
        (asked if asked is not None else []).append(temperature)
        return await reply(policy) if callable(reply) else answer(reply)

    async def emit(policy: str, *rest: Any) -> None:
        (emitted if emitted is not None else []).append(policy)

    return Episode("e", job, None, random.Random(0), generate, emit)


def yes_no(text: str) -> float | None:
    return {"yes": 1.0, "no": 0.0}.get(text.strip())


async def test_a_judges_yes_or_no_is_the_score_answered_greedily_unless_the_job_says() -> None:
    asked: list[Any] = []
    assert await episode(spec(), "yes", asked=asked).judge("judge", "2+2=4?", yes_no) == 1.0
    assert await episode(spec(), "no", asked=asked).judge("judge", "2+2=5?", yes_no) == 0.0
    await episode(spec(temperature=0.7), "no", asked=asked).judge("judge", "2+2=5?", yes_no)
    assert asked == [0.0, 0.0, 0.7]


async def test_an_answer_without_a_verdict_drops_the_episode_for_the_judge() -> None:
    with pytest.raises(JudgeFailed, match="no verdict in its answer 'maybe'") as failed:
        await episode(spec(), "maybe").judge("judge", "2+2=4?", yes_no)
    assert (failed.value.reason, failed.value.policy) == ("judge", "judge")


async def test_a_judge_slower_than_its_timeout_drops_the_episode_and_its_request_is_cancelled() -> (
    None
):
    cancelled = asyncio.Event()

    async def never(policy: str) -> GenerationResponse:
        try:
            await asyncio.sleep(30)
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    with pytest.raises(JudgeFailed, match="timeoutSeconds"):
        await episode(spec(), never).judge("judge", "2+2=4?", yes_no)
    assert cancelled.is_set()


async def test_a_judge_whose_pool_fails_drops_the_episode_as_judge_not_generation() -> None:
    async def unanswered(policy: str) -> GenerationResponse:
        raise EpisodeDropped("no answer", reason="generation", policy=policy)

    with pytest.raises(JudgeFailed) as failed:
        await episode(spec(), unanswered).judge("judge", "2+2=4?", yes_no)
    assert failed.value.reason == "judge"


async def test_with_a_fallback_score_a_failed_verdict_gives_it_counted_apart() -> None:
    made = episode(spec(fallbackScore=0.25), "maybe")
    assert await made.judge("judge", "2+2=4?", yes_no) == 0.25
    assert await made.judge("judge", "2+2=4?", yes_no) == 0.25
    assert made.judge_fallbacks == {"judge": 2}
    given = episode(spec(fallbackScore=0.25), "yes")
    assert await given.judge("judge", "2+2=4?", yes_no) == 1.0
    assert given.judge_fallbacks == {}  # only failed verdicts are counted


async def test_a_slow_judge_holds_only_the_episode_that_waits_for_it() -> None:
    release = asyncio.Event()

    async def slow(policy: str) -> GenerationResponse:
        await release.wait()
        return answer("yes")

    job = spec(timeoutSeconds=30)
    waiting = asyncio.create_task(episode(job, slow).judge("judge", "a?", yes_no))
    done = await asyncio.wait_for(episode(job, "no").judge("judge", "b?", yes_no), 5)
    assert done == 0.0
    assert not waiting.done()
    release.set()
    assert await waiting == 1.0


async def test_a_frozen_policy_takes_no_samples() -> None:
    emitted: list[str] = []
    made = episode(spec(), "4", emitted)
    with pytest.raises(ValueError, match="'judge' is frozen"):
        await made.emit("judge", "g", answer("4"), 0, 1.0)
    await made.emit("solver", "g", answer("4"), 0, 1.0)
    assert emitted == ["solver"]
