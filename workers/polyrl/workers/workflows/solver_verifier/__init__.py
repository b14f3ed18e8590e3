"""The solver-verifier workflow: a solver answers, a verifier judges the answers.

The solver answers a group of samples of one problem, each rewarded by the task's check.
For two of its answers (one right and one wrong where the group has both: `balanced_pick`),
the verifier is asked, a group of times, whether the answer is right: it writes its own
working, then "y" or "n" (`verdicts`), and is rewarded for agreeing with the task's check.
Both policies learn from the same episode; while the verifier's trainer is still warming up,
and once it is done, episodes do not ask it (`Episode.available`).

Its roles: the solver warms up on the task's answers and is scored by held-out accuracy; the
verifier warms up on worked verdicts of right and near-miss answers and is scored by
balanced accuracy on those and on an exam of the warm-started solver's own answers, which
the solver's trainer hands to the verifier's before RL (`exam`). The runner reports how well
the verifier judges the answers it is actually shown, by weight version (`judging`).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from polyrl.api.resources import RLJobSpec
from polyrl.workers.tasks import base
from polyrl.workers.tasks.rewards import RewardFailed
from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.interface import PolicyRole
from polyrl.workers.workflows.solver_verifier import evaluation, verdicts
from polyrl.workers.workflows.solver_verifier.judging import JudgedAccuracy

JUDGED_PER_EPISODE = 2


class SolverVerifier:
    name = "solver-verifier"

    def __init__(self) -> None:
        self.judging = JudgedAccuracy()

    def roles(self, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
        if len(spec.policies) != 2:
            raise ValueError(
                f"it uses two policies (a solver, then a verifier); the job has {len(spec.policies)}"
            )
        solver, verifier = (p.name for p in spec.policies)
        fmt = verdicts.of(spec)
        return {
            solver: PolicyRole("answers", task, evaluation.SolverEvaluation(task)),
            verifier: PolicyRole(
                "judges the solver's answers",
                verdicts.VerificationTask(task, fmt),
                evaluation.VerifierEvaluation(task, solver, fmt),
                max_new_tokens=fmt.budget(spec.algorithm.max_new_tokens),
            ),
        }

    async def run(self, episode: Episode) -> None:
        solver, verifier = (p.name for p in episode.spec.policies[:2])
        problem = episode.task.sample(episode.rng)
        answers = await episode.generate(solver, problem.request, episode.group_size)
        correct: dict[int, bool] = {}
        for i in range(len(answers.completions)):
            try:
                right = episode.task.reward(problem, episode.text(answers, i)) > 0.5
            except (
                RewardFailed
            ) as err:  # a user's reward: that answer is neither emitted nor judged
                episode.drop(str(err))
                continue
            correct[i] = right
            await episode.emit(solver, "answer", answers, i, 1.0 if right else 0.0)
        await episode.settle()  # the answers go out now, not after the verdicts
        if not episode.available(verifier):
            return  # its trainer is done (its verdicts would be wasted) or still warming up
        scored = sorted(correct)  # the answers with a reward (all, unless a reward failed)
        judged = [scored[k] for k in balanced_pick([correct[i] for i in scored], episode.rng)]
        fmt = verdicts.of(episode.spec)
        budget = fmt.budget(episode.spec.algorithm.max_new_tokens)
        prompts = [fmt.prompt(problem, episode.text(answers, i)) for i in judged]
        responses = await asyncio.gather(
            *(
                episode.generate(verifier, prompt, episode.group_size, max_new_tokens=budget)
                for prompt in prompts
            )
        )
        for i, response in zip(judged, responses, strict=True):
            for j in range(len(response.completions)):
                said = fmt.parse(episode.text(response, j))
                reward = verdicts.verdict_reward(said, correct[i])
                await episode.emit(verifier, f"verdict-{i}", response, j, reward)
                self.judging.add(verifier, response.weight_version, correct[i], said)

    def report(self) -> list[dict[str, Any]]:
        return self.judging.closed()

    def flush(self) -> list[dict[str, Any]]:
        return self.judging.flush()


def balanced_pick(correct: list[bool], rng: random.Random) -> list[int]:
    """Which answers the verifier judges: one right and one wrong where the group has both.

    Judging every answer would cost the verifier a group of samples per answer (64 for a
    group of 8) and, while the solver is mostly wrong, teach it that "no" is nearly always
    right; a balanced pair teaches both verdicts and keeps the verifier's share of the work
    at two groups per episode.
    """
    right = [i for i, ok in enumerate(correct) if ok]
    wrong = [i for i, ok in enumerate(correct) if not ok]
    if right and wrong:
        return sorted([rng.choice(right), rng.choice(wrong)])
    indices = list(range(len(correct)))
    return sorted(rng.sample(indices, min(JUDGED_PER_EPISODE, len(indices))))
