"""Environments: multi-turn episodes as `reset()` and `step(action)`, and the workflow that
drives one for a policy.

An environment is the world a policy acts in, one episode at a time: `reset(problem)` gives
the first observation (chat messages), `step(action)` takes the policy's reply and gives the
next observation, a reward and whether the episode is done. That is OpenEnv's interface
(`reset() -> observation`, `step(action) -> observation, reward, done`) with chat messages for
observations and a reply's text for actions, and the loop of verifiers' `MultiTurnEnv`
(`env_response` until `is_completed`), with the reward given by the environment instead of a
rubric. Both are async, so an environment may wait on a tool, a service or another policy.

`EnvironmentWorkflow` runs one: each episode draws a problem from the job's task and plays a
group of `algorithm.groupSize` conversations from it, each with an environment of its own
(`make(task)`), the replies token-exact (`conversation`). A conversation's reward is the sum
of its steps'. `ToolEnvironment` is the common case: the policy answers a task's problem and
may call tools first (`toolcalls`). Evaluation plays the task's held-out problems the same
way with greedy replies (`EnvironmentAccuracy`).

Failures: a tool that fails, an environment that raises, or a conversation past its limits
ends the whole episode (`dropped.EpisodeDropped`, counted by reason): its group is dropped as
a whole, never sent with members missing or scored 0 in their place.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from polyrl.api.resources import RLJobSpec
from polyrl.workers.tasks import base
from polyrl.workers.workflows import toolcalls
from polyrl.workers.workflows.conversation import Conversation
from polyrl.workers.workflows.dropped import EpisodeDropped
from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.interface import Handoff, PolicyRole, Scorer

Message = Mapping[str, str]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Step:
    """What an environment says after an action."""

    observation: Sequence[Message] = ()
    """Messages shown to the policy next (a tool's answer, a user's turn); none when done."""
    reward: float = 0.0
    done: bool = False


@runtime_checkable
class Environment(Protocol):
    """One episode's world (see the module docstring)."""

    async def reset(self, problem: base.Problem) -> Sequence[Message]:
        """Start on `problem`; the first observation. The same problem gives the same first
        observation: a group's conversations start from one prompt (the first environment's),
        and what differs between them is the policy's replies and what follows them."""

    async def step(self, action: str) -> Step:
        """The policy said `action`: what follows."""


class EnvironmentFailed(EpisodeDropped):
    """An environment raised: the episode is dropped (reason `environment`)."""

    reason = "environment"


class ToolEnvironment:
    """A task's problem, which the policy answers after calling tools as often as it likes
    (each reply with a `<tool_call>` gets the tools' answers; the first without one is its
    answer, rewarded by the task)."""

    def __init__(
        self, task: base.Task, tools: toolcalls.Tools, *, system: str | None = None
    ) -> None:
        self.task, self.tools, self.system = task, tools, system
        self.problem: base.Problem | None = None

    @property
    def tool_calls(self) -> int:
        return self.tools.calls

    async def reset(self, problem: base.Problem) -> list[dict[str, str]]:
        self.problem = problem
        first = [{"role": "system", "content": self.system}] if self.system else []
        return [*first, {"role": "user", "content": problem.prompt}]

    async def step(self, action: str) -> Step:
        if self.problem is None:
            raise RuntimeError("step before reset")
        calls = toolcalls.parse(action)
        if calls:
            return Step([await self.tools.answer(call) for call in calls])
        return Step(reward=self.task.reward(self.problem, action), done=True)


Make = Callable[[base.Task], Environment]


@dataclass
class Tally:
    """What a workflow's episodes came to, since the last report."""

    episodes: int = 0
    turns: int = 0
    tool_calls: int = 0
    with_tool_calls: int = 0
    rewards: float = 0.0

    def record(
        self, conversations: Sequence[Conversation], envs: Sequence[Any], rewards: Sequence[float]
    ) -> None:
        for conversation, env, reward in zip(conversations, envs, rewards, strict=True):
            calls = int(getattr(env, "tool_calls", 0))
            self.episodes += 1
            self.turns += conversation.turns
            self.tool_calls += calls
            self.with_tool_calls += calls > 0
            self.rewards += reward


class EnvironmentWorkflow:
    """Drives `make(task)` environments for the job's one policy (see the module docstring).

    `warmup(task)`: supervised examples for its warm-up (transcripts of the turns to learn,
    such as tool calls), or None; the evaluation is `EnvironmentAccuracy`."""

    name = "environment"

    def __init__(
        self,
        make: Make,
        *,
        warmup: Callable[[base.Task], base.Task] | None = None,
        role: str = "acts",
        held_out: int = 200,
    ) -> None:
        self.make, self.warmup, self.role, self.held_out = make, warmup, role, held_out
        self.tally = Tally()
        self.policy = ""

    def roles(self, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
        if len(spec.policies) != 1:
            raise ValueError(f"it drives one policy; the job has {len(spec.policies)}")
        self.policy = spec.policies[0].name
        evaluator = EnvironmentAccuracy(
            self.make, task, max_turns=spec.workflow.max_turns, problems=self.held_out
        )
        warmup = self.warmup(task) if self.warmup is not None else None
        return {self.policy: PolicyRole(self.role, warmup, evaluator)}

    async def run(self, episode: Episode) -> None:
        policy = episode.spec.policies[0].name
        problem = episode.task.sample(episode.rng)
        envs = [self.make(episode.task) for _ in range(episode.group_size)]
        first = [await _guarded(env.reset(problem)) for env in envs]
        start = await episode.converse(policy, first[0])
        branches = await episode.reply(start, episode.group_size)
        try:
            async with asyncio.TaskGroup() as group:  # one fails: the others are cancelled
                played = [
                    group.create_task(self._play(episode, env, branch))
                    for env, branch in zip(envs, branches, strict=True)
                ]
        except BaseExceptionGroup as failed:
            raise _first(failed) from None  # as if played one by one: the runner counts it
        results = [task.result() for task in played]
        self.tally.record([c for c, _ in results], envs, [r for _, r in results])
        for index, (conversation, reward) in enumerate(results):
            await episode.emit_conversation("episode", conversation, index, reward)

    async def _play(
        self, episode: Episode, env: Environment, conversation: Conversation
    ) -> tuple[Conversation, float]:
        total = 0.0
        while True:
            step = await _guarded(env.step(conversation.last))
            total += step.reward
            if step.done:
                return conversation, total
            conversation = await episode.tell(conversation, *step.observation)
            [conversation] = await episode.reply(conversation)

    def report(self) -> list[dict[str, Any]]:
        """Conversations played (a group's each), turns and tool calls per conversation, the
        share that called a tool."""
        tally, self.tally = self.tally, Tally()
        if not tally.episodes:
            return []
        n = tally.episodes
        return [
            {
                "source": "workflow",
                "policy": self.policy,
                "conversations": n,
                "turns_mean": tally.turns / n,
                "tool_calls_mean": tally.tool_calls / n,
                "tool_call_share": tally.with_tool_calls / n,
                "reward_mean": tally.rewards / n,
            }
        ]

    def flush(self) -> list[dict[str, Any]]:
        return self.report()


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first failure in `group`, however deep."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


async def _guarded(step: Coroutine[Any, Any, T]) -> T:
    """An environment's call; anything it raises but a drop becomes `EnvironmentFailed`."""
    try:
        return await step
    except EpisodeDropped:
        raise
    except Exception as err:
        raise EnvironmentFailed(f"the environment failed: {type(err).__name__}: {err}") from err


@dataclass
class EnvironmentAccuracy:
    """Held-out evaluation of an environment policy: each held-out problem played to its end
    with greedy replies (up to `max_turns`), all problems a turn at a time; the mean reward,
    and tool calls per problem. Replies go back as chat messages (the scorer renders the
    history through the template: greedy evaluation need not be token-exact), and a problem
    whose episode is dropped scores 0."""

    make: Make
    task: base.Task
    max_turns: int = 8
    problems: int = 200
    headline: str = "accuracy"
    failures: Counter[str] = field(default_factory=Counter)

    async def prepare(self, handoff: Handoff, scorer: Scorer, *, first: bool) -> None:
        return None

    def evaluate(self, scorer: Scorer) -> dict[str, float]:
        self.failures.clear()
        return _run(self._evaluate(scorer))

    async def _evaluate(self, scorer: Scorer) -> dict[str, float]:
        problems = self.task.held_out()[: self.problems]
        envs = [self.make(self.task) for _ in problems]
        talks: list[list[Message]] = []
        for env, problem in zip(envs, problems, strict=True):
            talks.append(list(await _guarded(env.reset(problem))))
        rewards = [0.0] * len(problems)
        playing = list(range(len(problems)))
        for _ in range(self.max_turns):
            if not playing:
                break
            replies = scorer.greedy([talks[i] for i in playing])
            going = await asyncio.gather(  # the environments' steps at once (tools take time)
                *(
                    self._step(envs[i], talks[i], text, rewards, i)
                    for i, text in zip(playing, replies, strict=True)
                )
            )
            playing = [i for i, on in zip(playing, going, strict=True) if on]
        calls = sum(int(getattr(env, "tool_calls", 0)) for env in envs)
        figures = {
            "accuracy": sum(rewards) / len(problems),
            "tool_calls_mean": calls / len(problems),
        }
        return figures | {f"dropped_{r}": n / len(problems) for r, n in self.failures.items()}

    async def _step(
        self, env: Environment, talk: list[Message], text: str, rewards: list[float], i: int
    ) -> bool:
        """Whether the problem plays on after `text`."""
        try:
            step = await _guarded(env.step(text))
        except EpisodeDropped as dropped:
            self.failures[dropped.reason] += 1
            return False
        talk += [{"role": "assistant", "content": text}, *step.observation]
        rewards[i] += step.reward
        return not step.done


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """`coroutine` to its end from synchronous code: on this thread, or on a thread of its own
    where this one already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    out: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(asyncio.run(coroutine))
        except BaseException as err:  # re-raised on the caller's thread
            errors.append(err)

    thread = threading.Thread(target=target, name="polyrl-evaluate")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


__all__ = [
    "Environment",
    "EnvironmentAccuracy",
    "EnvironmentFailed",
    "EnvironmentWorkflow",
    "Step",
    "ToolEnvironment",
]
