"""A calculator tool for arithmetic word problems: a multi-turn, tool-using episode.

The policy is asked a word problem ("Ann has 7 pens and gets 5 more. How many pens?"). It
may call the calculator, written as ChatML models write tool calls,

    <tool_call>{"name":"calc","arguments":{"x":"7+5"}}</tool_call>

and is shown the tool's answer (a `tool` message: "12"); its first reply without a call is
its answer, rewarded 1 when its last number is right. The tool (examples/calculator_tool.py)
runs in polyrl's sandbox: a subprocess with a timeout and a memory cap
(`polyrl.workers.workflows.sandbox`).

A tiny model never writes a parsable call by chance, so the policy warms up on transcripts
of both turns (`Transcripts`): the problem answered by a call, and the problem, the call and
the tool's answer answered by the number. Used by examples/calculator.yaml as
`workflow.name: calculator:workflow`, `workflow.task.name: calculator:word_problems`.
"""

from __future__ import annotations

import random
import re
from typing import Any

from calculator_tool import calc

from polyrl.workers.tasks import base
from polyrl.workers.workflows.environment import EnvironmentWorkflow, ToolEnvironment
from polyrl.workers.workflows.toolcalls import Tools, format_call, message

NAMES = ("Ann", "Bob", "Cy", "Dee")
THINGS = ("pens", "cards", "cups")


class WordProblems(base.GeneratedTask):
    """ "Ann has 7 pens and gets 5 more. How many pens?" (or "gives away 5"), numbers 2 to
    `most` (and the first at least the second for a difference)."""

    name = "word-problems"

    def __init__(self, *, held_out: int, seed: int, most: int = 9) -> None:
        self.most = most
        super().__init__(held_out=held_out, seed=seed)

    def space_size(self) -> int:
        return (self.most - 1) ** 2 * len(NAMES) * len(THINGS)

    def generate(self, rng: random.Random) -> base.Problem:
        who, what = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(2, self.most), rng.randint(2, self.most)
        if rng.random() < 0.5:
            prompt, expression = (
                f"{who} has {a} {what} and gets {b} more. How many {what}?",
                f"{a}+{b}",
            )
        else:
            a, b = max(a, b), min(a, b)
            prompt, expression = (
                f"{who} has {a} {what} and gives away {b}. How many {what}?",
                f"{a}-{b}",
            )
        answer = str(calc(expression))
        return base.Problem(
            prompt, answer, base.problem_id(self.name, prompt), meta={"expression": expression}
        )

    def reward(self, problem: base.Problem, completion: str) -> float:
        numbers = re.findall(r"-?\d+", completion)
        return 1.0 if numbers and numbers[-1] == problem.answer else 0.0


def word_problems(params: dict[str, Any], *, held_out: int, seed: int) -> WordProblems:
    """The task's entry point (`workflow.task.name: calculator:word_problems`); `params:
    {most: 49}` for numbers up to 49."""
    unknown = sorted(set(params) - {"most"})
    if unknown:
        raise ValueError(f"word_problems takes `most` (the largest number), not {unknown}")
    return WordProblems(held_out=held_out, seed=seed, most=int(params.get("most", 9)))


class Transcripts:
    """Warm-up examples of both turns of a tool-using answer to the task's problems: half
    the problem answered by the call, half the call's answer answered by the number."""

    name = "word-problems-transcripts"

    def __init__(self, task: base.Task) -> None:
        self.task = task

    def example(self, problem: base.Problem, second: bool) -> base.Problem:
        call = format_call("calc", {"x": (problem.meta or {})["expression"]})
        if not second:
            return base.Problem(
                problem.prompt,
                call,
                problem.id + "/call",
                messages=({"role": "user", "content": problem.prompt},),
            )
        talk = (
            {"role": "user", "content": problem.prompt},
            {"role": "assistant", "content": call},
            message(problem.answer),
        )
        return base.Problem(problem.prompt, problem.answer, problem.id + "/answer", messages=talk)

    def sample(self, rng: random.Random) -> base.Problem:
        return self.example(self.task.sample(rng), second=rng.random() < 0.5)

    def held_out(self) -> list[base.Problem]:
        return [self.example(p, second) for p in self.task.held_out() for second in (False, True)]

    def reward(self, problem: base.Problem, completion: str) -> float:
        return 1.0 if completion.strip() == problem.answer else 0.0


def calculator(task: base.Task) -> ToolEnvironment:
    return ToolEnvironment(task, Tools({"calc": "calculator_tool:calc"}))


workflow = EnvironmentWorkflow(calculator, warmup=Transcripts, role="answers with a calculator")
