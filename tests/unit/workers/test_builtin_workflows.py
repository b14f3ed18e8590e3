"""The built-in workflows over a real task, with the episode's two verbs recorded in memory.

`Episode`'s verbs are injected (NATS in a run); recording them here shows which policies an
episode asks and what it sends each trainer, which is all a workflow decides.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from polyrl.api.resources import RLJobSpec
from polyrl.api.wire import Completion, GenerationResponse
from polyrl.workers.tasks.loading import load_task
from polyrl.workers.tasks.rewards import RewardFailed
from polyrl.workers.workflows import Episode
from polyrl.workers.workflows.sample import Sample
from polyrl.workers.workflows.solver_verifier import SolverVerifier

SPEC = RLJobSpec.model_validate(
    {
        "policies": [
            {"name": name, "model": {"path": "tiny-llama://t"}} for name in ("solver", "verifier")
        ],
        "workflow": {"name": "solver-verifier", "task": {"name": "arithmetic"}},
        "algorithm": {"groupSize": 4, "maxNewTokens": 3},
    }
)


VERIFIER_TEXTS = ("7", "12y", "99", "5n")
SOLVER_TEXTS = ("1", "2", "3", "4")


def episode(
    finished: frozenset[str],
    warming: frozenset[str] = frozenset(),
    *,
    spec: RLJobSpec = SPEC,
    texts: tuple[tuple[str, ...], tuple[str, ...]] = (SOLVER_TEXTS, VERIFIER_TEXTS),
    prompts: list[tuple[Any, int]] | None = None,
) -> tuple[Episode, list[str], list[tuple[str, float]]]:
    """An episode whose policies answer with `texts` (solver's, verifier's), cycled; what it
    asked (and, given `prompts`, the verifier's prompts and budgets) and sent are recorded."""
    asked: list[str] = []
    sent: list[tuple[str, float]] = []

    async def generate(policy: str, prompt: Any, n: int, max_new: int) -> GenerationResponse:
        asked.append(policy)
        said = texts[1] if policy == "verifier" else texts[0]
        if policy == "verifier" and prompts is not None:
            prompts.append((prompt, max_new))
        completions = [
            Completion(tokens=[1], logprobs=[-0.1], text=said[i % len(said)], finish_reason="stop")
            for i in range(n)
        ]
        return GenerationResponse(
            id="r", pod="p", weight_version=3, prompt_tokens=[1], completions=completions
        )

    async def emit(policy: str, group: str, sample: Sample, index: int, reward: float) -> None:
        sent.append((policy, reward))

    made = Episode(
        id="e",
        spec=spec,
        task=load_task(spec.workflow.task),
        rng=random.Random(0),
        _generate=generate,
        _emit=emit,
        finished=finished,
        warming=warming,
    )
    return made, asked, sent


def judged(workflow: SolverVerifier) -> int:
    """Verdicts the workflow tallied (how well its verifier judges: `judging`)."""
    return sum(t.right + t.wrong for t in workflow.judging.tallies.values())


async def test_solver_verifier_asks_the_verifier_to_judge_two_answers() -> None:
    made, asked, sent = episode(frozenset())
    workflow = SolverVerifier()
    await workflow.run(made)
    assert asked == ["solver", "verifier", "verifier"]
    assert [p for p, _ in sent] == ["solver"] * 4 + ["verifier"] * 8
    assert judged(workflow) == 8


async def test_solver_verifier_settles_the_answers_before_asking_the_verifier() -> None:
    """So that a refilled solver's answers do not wait for the verdicts (`Episode.settle`)."""
    made, asked, sent = episode(frozenset())
    settled: list[tuple[int, int]] = []

    async def settle() -> None:
        settled.append((len(asked), len(sent)))

    made._settle = settle
    workflow = SolverVerifier()
    await workflow.run(made)
    assert settled == [(1, 4)]  # after the solver's answers were asked for and emitted, only
    assert {index for _, index in workflow.judging.tallies} == {0}  # versions 0-9 (3)


@pytest.mark.parametrize("finished", [frozenset({"verifier"}), frozenset({"verifier", "x"})])
async def test_once_the_verifiers_trainer_is_done_only_the_solver_is_asked(
    finished: frozenset[str],
) -> None:
    made, asked, sent = episode(finished)
    workflow = SolverVerifier()
    await workflow.run(made)
    assert asked == ["solver"]
    assert [p for p, _ in sent] == ["solver"] * 4
    assert judged(workflow) == 0


async def test_while_the_verifiers_trainer_warms_up_only_the_solver_is_asked() -> None:
    made, asked, sent = episode(frozenset(), warming=frozenset({"verifier"}))
    workflow = SolverVerifier()
    await workflow.run(made)
    assert asked == ["solver"]
    assert [p for p, _ in sent] == ["solver"] * 4
    assert judged(workflow) == 0


async def test_a_warming_solver_is_still_asked_since_an_episode_cannot_go_without_it() -> None:
    made, asked, _ = episode(frozenset(), warming=frozenset({"solver"}))
    await SolverVerifier().run(made)
    assert asked == ["solver", "verifier", "verifier"]


class FailingOnThree:
    """The arithmetic task with a reward that fails on the answer "3", as a user's might."""

    def __init__(self, task: Any) -> None:
        self.task, self.name = task, task.name

    def sample(self, rng: random.Random) -> Any:
        return self.task.sample(rng)

    def held_out(self) -> list[Any]:
        return list(self.task.held_out())

    def reward(self, problem: Any, completion: str) -> float:
        if completion == "3":
            raise RewardFailed("reward f on problem p: raised KeyError('x')")
        return 1.0 if completion == "1" else 0.0


async def test_a_failed_reward_drops_that_answer_only_and_says_why() -> None:
    made, asked, sent = episode(frozenset())
    made.task = FailingOnThree(made.task)
    await SolverVerifier().run(made)
    assert [r for p, r in sent if p == "solver"] == [1.0, 0.0, 0.0]  # "3" left out
    assert made.dropped == ["reward f on problem p: raised KeyError('x')"]
    assert asked == ["solver", "verifier", "verifier"]  # a right and a wrong one still judged


async def test_a_chat_verifier_gets_its_messages_and_its_verdicts_are_read_with_its_pattern() -> (
    None
):
    doc = SPEC.model_dump(by_alias=True)
    doc["workflow"]["verifier"] = {
        "messages": [{"role": "user", "content": "Is {candidate} the answer to {problem}?"}],
        "answer": "{working} => {verdict}",
        "verdictPattern": r"=>\s*(\w+)",
        "right": "right",
        "wrong": "wrong",
    }
    spec = RLJobSpec.model_validate(doc)
    prompts: list[tuple[Any, int]] = []
    # The solver answers "4" or "5", right only where that is the answer: `picked` below.
    verifier = ("4 => right", "4 => wrong", "no verdict here", "4 => RIGHT")
    made, _, sent = episode(frozenset(), spec=spec, texts=(("4", "5"), verifier), prompts=prompts)
    await SolverVerifier().run(made)
    assert len(prompts) == 2
    for messages, budget in prompts:
        (message,) = messages
        assert message["role"] == "user"
        assert message["content"].startswith("Is ")
        assert " the answer to " in message["content"]
        assert budget == 3 + 16  # the solver's budget and room for the verdict line
    solver_right = [r == 1.0 for p, r in sent if p == "solver"]
    verdicts = [r for p, r in sent if p == "verifier"]
    assert len(verdicts) == 8
    # A right candidate earns two verdicts ("right", "RIGHT"), a wrong one one ("wrong"); "no
    # verdict here" earns none. One of each is judged where the solver has both.
    picked = [True, False] if any(solver_right) and not all(solver_right) else solver_right[:2]
    assert sum(verdicts) == sum(2 if right else 1 for right in picked)
