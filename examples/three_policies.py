"""A three-policy workflow, written against polyrl's workflow interface (docs/workflows.md).

A `solver` answers an addition the usual way; a `reverser` answers the same addition with
its digits written least significant first (as a second opinion in another form); a
`checker` judges one answer of each (turned back into the usual form), writing its own
working and then "y" or "n". Each policy is rewarded by the task's own check: the two
answering policies for being right, the checker for agreeing with the truth. Each declares
its warm-up examples and its held-out evaluation, so `trainer.warmupSteps` and
`trainer.evalEvery` apply to all three.

Used by examples/three-policies.yaml as `workflow.name: three_policies:ThreePolicies`;
`polyrl run` finds this module beside the job file.
"""

from __future__ import annotations

import asyncio
import random

from polyrl.api.resources import RLJobSpec
from polyrl.workers.tasks import arithmetic, base
from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.interface import PolicyRole, TaskAccuracy
from polyrl.workers.workflows.solver_verifier import verdicts


class Reversed:
    """The job's arithmetic task with its answers written reversed: the same problems and the
    same held-out split, so no policy trains on another's held-out problems."""

    name = "arithmetic-reversed"

    def __init__(self, task: base.Task) -> None:
        if not isinstance(task, arithmetic.Arithmetic) or task.reverse:
            raise ValueError("it needs the arithmetic task, its answers not reversed")
        self.task = task

    def flip(self, problem: base.Problem) -> base.Problem:
        answer = arithmetic.written(int(problem.answer), reverse=True)
        return base.Problem(problem.prompt, answer, problem.id)

    def sample(self, rng: random.Random) -> base.Problem:
        return self.flip(self.task.sample(rng))

    def held_out(self) -> list[base.Problem]:
        return [self.flip(problem) for problem in self.task.held_out()]

    def reward(self, problem: base.Problem, completion: str) -> float:
        return self.task.reward(problem, completion)


class ThreePolicies:
    name = "three-policies"

    def __init__(self) -> None:
        self.reverse: Reversed | None = None

    def roles(self, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
        names = [p.name for p in spec.policies]
        if names != ["solver", "reverser", "checker"]:
            raise ValueError(f"it uses the policies solver, reverser, checker; the job has {names}")
        self.reverse = Reversed(task)
        judge = verdicts.VerificationTask(task)
        budget = verdicts.verifier_max_new_tokens(spec.algorithm.max_new_tokens)
        return {
            "solver": PolicyRole("answers", task, TaskAccuracy(task)),
            "reverser": PolicyRole("answers reversed", self.reverse, TaskAccuracy(self.reverse)),
            # Held-out right and near-miss answers, half each: accuracy is balanced accuracy.
            "checker": PolicyRole("judges", judge, TaskAccuracy(judge), max_new_tokens=budget),
        }

    async def run(self, episode: Episode) -> None:
        if self.reverse is None:
            self.reverse = Reversed(episode.task)
        problem = episode.task.sample(episode.rng)
        backwards = self.reverse.flip(problem)
        n = episode.group_size
        answers, reversed_answers = await asyncio.gather(
            episode.generate("solver", problem.prompt, n),
            episode.generate("reverser", problem.prompt, n),
        )
        candidates = []
        for i in range(n):
            text = episode.text(answers, i)
            await episode.emit("solver", "answer", answers, i, episode.task.reward(problem, text))
            flipped = episode.text(reversed_answers, i)
            reward = self.reverse.reward(backwards, flipped)
            await episode.emit("reverser", "reversed", reversed_answers, i, reward)
            candidates += [text, unreversed(flipped)]
        await episode.settle()
        if episode.available("checker"):
            await self.check(episode, problem, [candidates[0], candidates[1]])

    async def check(self, episode: Episode, problem: base.Problem, candidates: list[str]) -> None:
        budget = verdicts.verifier_max_new_tokens(episode.spec.algorithm.max_new_tokens)
        prompts = [verdicts.verify_prompt(problem, c) for c in candidates]
        asks = [
            episode.generate("checker", p, episode.group_size, max_new_tokens=budget)
            for p in prompts
        ]
        responses = await asyncio.gather(*asks)
        for k, (candidate, response) in enumerate(zip(candidates, responses, strict=True)):
            right = episode.task.reward(problem, candidate) > 0.5
            for j in range(len(response.completions)):
                said = verdicts.parse_verdict(episode.text(response, j))
                reward = verdicts.verdict_reward(said, right)
                await episode.emit("checker", f"check-{k}", response, j, reward)


def unreversed(answer: str) -> str:
    """A reversed answer written the usual way (its digits back in order, the sign kept)."""
    text = base.answer_text(answer)
    sign = "-" if text.startswith("-") else ""
    return sign + text.removeprefix("-")[::-1]
