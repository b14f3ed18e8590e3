"""The built-in workflows.

`single`: the first policy answers a group of samples of one problem; each is rewarded by
the task's exact check. `solver-verifier`: the solver answers a group; for each answer the
verifier is asked, a group of times, whether it is right; the solver is rewarded by the
ground truth, the verifier for agreeing with it. Both policies learn from the same episode.
"""

from __future__ import annotations

import asyncio

from polyrl.workers import tasks
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
    prompts = [
        tasks.verify_prompt(problem, episode.text(answers, i))
        for i in range(len(answers.completions))
    ]
    responses = await asyncio.gather(
        *(
            episode.generate(verifier, prompt, episode.group_size, max_new_tokens=2)
            for prompt in prompts
        )
    )
    for i, response in enumerate(responses):
        for j in range(len(response.completions)):
            said = tasks.parse_verdict(episode.text(response, j))
            reward = 1.0 if said is not None and said == correct[i] else 0.0
            await episode.emit(verifier, f"verdict-{i}", response, j, reward)
