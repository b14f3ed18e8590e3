"""Environments and tools (`workflows.environment`, `workflows.toolcalls`): the workflow that
drives an environment plays a group of token-exact conversations, the tool's output shown
to the policy and masked out of its loss; a failing tool or environment drops the episode
whole. The tool runs in the real sandbox; the rollout pool is scripted (`scripted`)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.unit.workers.scripted import Pool, TinyBpe, episode, load, spec

from polyrl.workers.tasks import base
from polyrl.workers.workflows import environment, sandbox, toolcalls
from polyrl.workers.workflows.dropped import EpisodeDropped

ROOT = str(Path(__file__).resolve().parents[3])
TOOLS = {
    "add": "tests.unit.workers.sandbox_tools:add",
    "hang": "tests.unit.workers.sandbox_tools:hang",
}
CALL = toolcalls.format_call("add", {"a": 12, "b": 7})


class Sums:
    """One problem, 12 + 7, rewarded by its last number."""

    name = "sums"
    problem = base.Problem("What is 12 plus 7?", "19", "sums-0")

    def sample(self, rng: random.Random) -> base.Problem:
        return self.problem

    def held_out(self) -> list[base.Problem]:
        return [self.problem] * 3

    def reward(self, problem: base.Problem, completion: str) -> float:
        return 1.0 if completion.strip().endswith(problem.answer) else 0.0


def tools_here(timeout: float = 5.0) -> toolcalls.Tools:
    return toolcalls.Tools(TOOLS, sandbox.Limits(timeout=timeout), path=[ROOT])


def make(task: base.Task) -> environment.ToolEnvironment:
    return environment.ToolEnvironment(task, tools_here())


def test_tool_calls_are_parsed_in_order_and_a_malformed_one_says_why() -> None:
    text = f'{CALL} then <tool_call>{{"name": "add"}}</tool_call><tool_call>{{"name": 3}}'
    calls = toolcalls.parse(text)
    assert calls[:2] == [
        toolcalls.ToolCall("add", {"a": 12, "b": 7}),
        toolcalls.ToolCall("add", {}),
    ]
    assert isinstance(calls[2], toolcalls.Malformed)
    assert "arguments" in calls[2].why
    [broken] = toolcalls.parse("<tool_call>{not json</tool_call>")
    assert isinstance(broken, toolcalls.Malformed)
    assert "not JSON" in broken.why
    assert toolcalls.parse("19") == []


async def test_a_group_calls_the_tool_and_trains_on_its_replies_with_the_tools_output_masked(
    tiny_bpe: TinyBpe,
) -> None:
    prompts = load(tiny_bpe, "qwen2")
    pool = Pool(prompts, [])
    pool.replies = [pool.text(CALL), pool.text("19"), pool.text("it is 19")]  # branch 0 calls
    workflow = environment.EnvironmentWorkflow(make)
    made, sent = episode(prompts, pool, spec(group_size=2), task=Sums())
    workflow.roles(made.spec, Sums())
    await workflow.run(made)

    called, direct = sent
    assert made.rewards == {"agent": [1.0, 1.0]}
    assert called.loss_mask is not None
    assert direct.loss_mask is not None
    shown = [t for t, on in zip(called.tokens, called.loss_mask, strict=True) if not on]
    decoded = prompts.tokenizer.backend.decode(shown, skip_special_tokens=False)
    assert decoded == "\n<|im_start|>tool\n19<|im_end|>\n<|im_start|>assistant\n"
    assert all(direct.loss_mask)  # one reply: every token after the prompt was sampled
    [report] = workflow.report()
    assert report["tool_call_share"] == 0.5
    assert report["turns_mean"] == 1.5


async def test_a_tool_that_hangs_drops_the_whole_episode_and_sends_nothing(
    tiny_bpe: TinyBpe,
) -> None:
    prompts = load(tiny_bpe, "qwen2")
    pool = Pool(prompts, [])
    hang = toolcalls.format_call("hang", {"seconds": 30})
    pool.replies = [pool.text(hang), pool.text("19")]

    def slow(task: base.Task) -> environment.ToolEnvironment:
        return environment.ToolEnvironment(task, tools_here(timeout=1.0))

    made, sent = episode(prompts, pool, spec(group_size=2), task=Sums())
    with pytest.raises(sandbox.ToolFailed, match="no answer within 1 s") as failed:
        await environment.EnvironmentWorkflow(slow).run(made)
    assert failed.value.reason == "tool"
    assert sent == []


class Broken:
    """An environment whose step raises, as a user's may."""

    async def reset(self, problem: base.Problem) -> Sequence[Mapping[str, str]]:
        return [{"role": "user", "content": problem.prompt}]

    async def step(self, action: str) -> environment.Step:
        raise KeyError("state")


async def test_an_environment_that_raises_drops_the_episode_with_reason_environment(
    tiny_bpe: TinyBpe,
) -> None:
    prompts = load(tiny_bpe, "qwen2")
    pool = Pool(prompts, [])
    pool.replies = [pool.text("1"), pool.text("2")]
    made, sent = episode(prompts, pool, spec(group_size=2), task=Sums())
    with pytest.raises(EpisodeDropped, match="KeyError") as failed:
        await environment.EnvironmentWorkflow(lambda task: Broken()).run(made)
    assert failed.value.reason == "environment"
    assert sent == []


class Replies:
    """A scorer whose greedy replies are scripted by turn."""

    max_new_tokens = answer_tokens = 16

    def __init__(self, turns: list[str]) -> None:
        self.turns = turns
        self.asked: list[list[Any]] = []

    def greedy(self, prompts: Sequence[Any], *, max_new_tokens: int | None = None) -> list[str]:
        self.asked.append([list(p) for p in prompts])  # as they were at the time
        return [self.turns[len(self.asked) - 1]] * len(prompts)

    def accuracy(self, *args: Any, **kwargs: Any) -> float:
        raise AssertionError("an environment is evaluated turn by turn")


def test_evaluation_plays_each_held_out_problem_to_its_end() -> None:
    evaluator = environment.EnvironmentAccuracy(make, Sums(), max_turns=3)
    scorer = Replies([CALL, "19"])
    figures = evaluator.evaluate(scorer)
    assert figures == {"accuracy": 1.0, "tool_calls_mean": 1.0}
    assert [m["role"] for m in scorer.asked[1][0]] == ["user", "assistant", "tool"]
    assert scorer.asked[1][0][2]["content"] == "19"
