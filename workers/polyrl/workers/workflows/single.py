"""The single workflow: one policy answers a group of samples of one problem.

Each sample is rewarded by the task's check; a sample whose reward fails (a user's function
raised, timed out or returned no number) is dropped and counted, the rest of the group goes. The policy warms up on the task's answers and
is scored by greedy accuracy on the task's held-out split.
"""

from __future__ import annotations

from polyrl.api.resources import RLJobSpec
from polyrl.workers.tasks import base
from polyrl.workers.tasks.rewards import RewardFailed
from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.interface import PolicyRole, TaskAccuracy


class Single:
    name = "single"

    def roles(self, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
        if len(spec.policies) != 1:
            raise ValueError(f"it uses one policy; the job has {len(spec.policies)}")
        return {spec.policies[0].name: PolicyRole("answers", task, TaskAccuracy(task))}

    async def run(self, episode: Episode) -> None:
        policy = episode.spec.policies[0].name
        problem = episode.task.sample(episode.rng)
        response = await episode.generate(policy, problem.request, episode.group_size)
        for i in range(len(response.completions)):
            try:
                reward = episode.task.reward(problem, episode.text(response, i))
            except RewardFailed as err:  # a user's reward: that sample only
                episode.drop(str(err))
                continue
            await episode.emit(policy, "answer", response, i, reward)
