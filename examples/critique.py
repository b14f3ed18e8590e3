"""A multi-turn exchange between two trained policies: a verifier's critique is the solver's
next turn (docs/workflows.md, "Multi-turn episodes").

Each episode: the solver answers a sum, in a group of conversations; the verifier judges each
answer (its working, then "y" or "n": "15y"), in a conversation of its own; its reply goes
back to the solver as the next user message ("A checker says: 15n. Your final answer?"), and
the solver answers again. Both are trained: the solver on its two-turn conversation (both of
its answers under the loss mask, the critique masked out), rewarded for its final answer;
the verifier on its verdict, rewarded for judging the first answer right. Text crosses
between the policies; each keeps its own conversation's ids.

Used by examples/critique.yaml as `workflow.name: critique:Critique`.
"""

from __future__ import annotations

import asyncio
import random

from polyrl.api.resources import RLJobSpec
from polyrl.workers.tasks import base
from polyrl.workers.workflows.conversation import Conversation
from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.interface import PolicyRole, TaskAccuracy
from polyrl.workers.workflows.solver_verifier import verdicts


def critique_message(verdict: str) -> dict[str, str]:
    """What the solver is told of the verifier's reply."""
    return {"role": "user", "content": f"A checker says: {verdict.strip()}. Your final answer?"}


class SecondTurns:
    """The solver's warm-up: half its first answers, half second ones (the sum, an answer
    right or a near miss, the checker's verdict on it, then the right answer)."""

    name = "critique-second-turns"

    def __init__(self, task: base.Task) -> None:
        self.task = task

    def example(self, problem: base.Problem, rng: random.Random) -> base.Problem:
        first = {"role": "user", "content": problem.prompt}
        if rng.random() < 0.5:
            return base.Problem(problem.prompt, problem.answer, problem.id, messages=(first,))
        miss = getattr(self.task, "near_miss", None) or base.near_miss
        said = problem.answer if rng.random() < 0.5 else miss(problem, rng)
        verdict = verdicts.verify_answer(self.task.reward(problem, said) > 0.5, problem.answer)
        talk = (first, {"role": "assistant", "content": said}, critique_message(verdict))
        return base.Problem(problem.prompt, problem.answer, problem.id + "/2", messages=talk)

    def sample(self, rng: random.Random) -> base.Problem:
        return self.example(self.task.sample(rng), rng)

    def held_out(self) -> list[base.Problem]:
        rng = random.Random(0)
        return [self.example(p, rng) for p in self.task.held_out()]

    def reward(self, problem: base.Problem, completion: str) -> float:
        return self.task.reward(problem, completion)


class Critique:
    name = "critique"

    def roles(self, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
        names = [p.name for p in spec.policies]
        if names != ["solver", "verifier"]:
            raise ValueError(f"it uses the policies solver and verifier; the job has {names}")
        judge = verdicts.VerificationTask(task)
        budget = verdicts.verifier_max_new_tokens(spec.algorithm.max_new_tokens)
        return {
            "solver": PolicyRole(
                "answers, then again after a critique", SecondTurns(task), TaskAccuracy(task)
            ),
            "verifier": PolicyRole("critiques", judge, TaskAccuracy(judge), max_new_tokens=budget),
        }

    async def run(self, episode: Episode) -> None:
        problem = episode.task.sample(episode.rng)
        start = await episode.converse("solver", [{"role": "user", "content": problem.prompt}])
        firsts = await episode.reply(start, episode.group_size)
        judged = await asyncio.gather(*(self.judge(episode, problem, c.last) for c in firsts))
        finals = await asyncio.gather(
            *(
                self.again(episode, c, verdict.last)
                for c, verdict in zip(firsts, judged, strict=True)
            )
        )
        for i, final in enumerate(finals):
            await episode.emit_conversation(
                "answer", final, i, episode.task.reward(problem, final.last)
            )
        for i, (first, verdict) in enumerate(zip(firsts, judged, strict=True)):
            right = episode.task.reward(problem, first.last) > 0.5
            reward = verdicts.verdict_reward(verdicts.parse_verdict(verdict.last), right)
            await episode.emit_conversation("verdict", verdict, i, reward)

    async def judge(self, episode: Episode, problem: base.Problem, answer: str) -> Conversation:
        budget = verdicts.verifier_max_new_tokens(episode.spec.algorithm.max_new_tokens)
        asked = verdicts.verify_prompt(problem, base.answer_text(answer))
        talk = await episode.converse("verifier", [{"role": "user", "content": asked}])
        [verdict] = await episode.reply(talk, max_new_tokens=budget)
        return verdict

    async def again(self, episode: Episode, first: Conversation, verdict: str) -> Conversation:
        talk = await episode.tell(first, critique_message(verdict))
        [final] = await episode.reply(talk)
        return final
