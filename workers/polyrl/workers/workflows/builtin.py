"""The built-in workflows.

`single`: the first policy answers a group of samples of one problem; each is rewarded by
the task's exact check. `solver-verifier`: the solver answers a group; for two of the answers (one
right and one wrong where there are both) the verifier is asked, a group of times, whether
it is right (it writes its own working, then "y" or "n": `tasks.verify`). The solver is
rewarded by the ground truth, the verifier for its verdict agreeing with it. Both policies learn
from the same episode; while the verifier's trainer is still warming up, and once it is done,
episodes do not ask it (`Episode.available`).
"""

from __future__ import annotations

import asyncio
import random

from polyrl.workers.tasks import verify
from polyrl.workers.workflows.episode import Episode


async def single(episode: Episode) -> None:
    policy = episode.spec.policies[0].name
    problem = episode.task.sample(episode.rng)
    response = await episode.generate(policy, problem.prompt, episode.group_size)
    for i in range(len(response.completions)):
        reward = episode.task.reward(problem, episode.text(response, i))
        await episode.emit(policy, "answer", response, i, reward)


async def solver_verifier(episode: Episode) -> None:
    if len(episode.spec.policies) < 2:
        raise ValueError("the solver-verifier workflow needs two policies (solver, verifier)")
    solver, verifier = (p.name for p in episode.spec.policies[:2])
    problem = episode.task.sample(episode.rng)
    answers = await episode.generate(solver, problem.prompt, episode.group_size)
    correct = []
    for i in range(len(answers.completions)):
        right = episode.task.reward(problem, episode.text(answers, i)) > 0.5
        correct.append(right)
        await episode.emit(solver, "answer", answers, i, 1.0 if right else 0.0)
    await episode.settle()  # the answers go out now, not after the verdicts
    if not episode.available(verifier):
        return  # its trainer is done (its verdicts would be wasted) or still warming up
    judged = balanced_pick(correct, episode.rng)
    responses = await asyncio.gather(
        *(
            episode.generate(
                verifier,
                verify.verify_prompt(problem, episode.text(answers, i)),
                episode.group_size,
                max_new_tokens=verify.verifier_max_new_tokens(
                    episode.spec.algorithm.max_new_tokens
                ),
            )
            for i in judged
        )
    )
    for i, response in zip(judged, responses, strict=True):
        for j in range(len(response.completions)):
            said = verify.parse_verdict(episode.text(response, j))
            reward = verify.verdict_reward(said, correct[i])
            await episode.emit(verifier, f"verdict-{i}", response, j, reward)
            episode.judged(verifier, response.weight_version, truth=correct[i], said=said)


JUDGED_PER_EPISODE = 2


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
