"""Rewards for dataset tasks: built-in `exact` and `math`, or a user's function as it is.

Users bring reward functions in the shapes the frameworks they use taught them, and call them
unchanged here:

* verl: `compute_score(data_source, solution_str, ground_truth, extra_info=None)` returning a
  float or a dict with `score`;
* TRL: `reward_func(prompts, completions, **columns)` returning a list of floats, where `None`
  means "not applicable" (the sample is dropped);
* OpenRLHF: `reward_func(queries, prompts, labels)` returning a list (or tensor) of floats, or a
  dict with `rewards`.

Sync or async (an async function runs in an event loop of its own thread). The style is
declared (`rewardStyle`) or detected from the parameter names. A reward that raises, takes
longer than `rewardTimeout` seconds, or returns something that is not a finite number raises
`RewardFailed` naming the problem: the workflow drops that sample and counts it, and the
worker goes on.

`math` checks answers with math-verify, the common checker: the ground truth and the
completion are parsed (the last `\\boxed{}`, else the final number or expression) and compared
symbolically. A ground truth it cannot parse scores every completion 0 and is counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from polyrl.api import taskparams
from polyrl.workers.tasks import base

Reward = Callable[[base.Problem, str], float]
STYLES = taskparams.REWARD_STYLES
_WORD = re.compile(r"[A-Za-z]{3,}")
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="reward")


class RewardFailed(ValueError):
    """A reward function raised, timed out, declined (None) or returned no finite number."""


def exact(problem: base.Problem, completion: str) -> float:
    """1 when the completion's answer text (up to its first newline) is the reference."""
    return 1.0 if base.answer_text(completion) == problem.answer.strip() else 0.0


class MathReward:
    """math-verify's symbolic comparison of the completion with the ground truth.

    math-verify bounds its own parsing with SIGALRM, which only the main thread may use, and
    rewards run in a workflow's or an evaluation's thread: its timeouts are off here and the
    whole check runs on the reward pool under `timeout` instead, like a user's function."""

    def __init__(self, *, timeout: float = 10.0) -> None:
        from math_verify import parse, verify

        self.timeout = timeout
        self.unparsable: set[str] = set()  # ground truths math-verify could not read
        # Its first use imports sympy and builds the LaTeX grammar: seconds on a busy
        # machine, which must not count against the first sample's timeout.
        verify(
            parse("$1$", parsing_timeout=None),
            parse("1", parsing_timeout=None),
            timeout_seconds=None,
        )

    def __call__(self, problem: base.Problem, completion: str) -> float:
        future = _POOL.submit(self._score, problem, completion)
        try:
            return future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            raise RewardFailed(
                f"math reward on problem {problem.id}: timed out after {self.timeout} s"
            ) from None

    def _score(self, problem: base.Problem, completion: str) -> float:
        from math_verify import parse, verify

        gold = parse(problem.answer, parsing_timeout=None)
        if not gold and not _WORD.search(problem.answer):  # an expression, not prose: "x^2+1"
            gold = parse(f"${problem.answer}$", parsing_timeout=None)
        if not gold:
            self.unparsable.add(problem.id)
            return 0.0
        answer = parse(completion, parsing_timeout=None)
        return 1.0 if verify(gold, answer, timeout_seconds=None) else 0.0


def detect_style(function: Callable[..., Any]) -> str:
    """verl, trl or openrlhf, from the function's parameter names."""
    names = set(inspect.signature(function).parameters)
    if {"solution_str", "ground_truth"} <= names:
        return "verl"
    if "completions" in names:
        return "trl"
    if {"queries", "labels"} <= names:
        return "openrlhf"
    raise ValueError(
        f"reward function {function.__qualname__}{inspect.signature(function)} matches no known "
        "signature: verl (data_source, solution_str, ground_truth, extra_info), TRL (prompts, "
        "completions, **columns) or OpenRLHF (queries, prompts, labels); set rewardStyle"
    )


def load_function(name: str) -> Callable[..., Any]:
    return base.entry_point(name, what="reward", builtins=["exact", "math"])


class UserReward:
    """A user's reward function called in its own style, with a timeout."""

    def __init__(self, function: Callable[..., Any], *, style: str | None, timeout: float) -> None:
        if style is not None and style not in STYLES:
            raise ValueError(f"rewardStyle {style!r}: expected one of {', '.join(STYLES)}")
        self.function, self.timeout = function, timeout
        self.style = style or detect_style(function)

    def __call__(self, problem: base.Problem, completion: str) -> float:
        future = _POOL.submit(self._call, problem, completion)
        try:
            value = future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            raise RewardFailed(
                f"{self._where(problem)}: timed out after {self.timeout} s"
            ) from None
        except RewardFailed:
            raise
        except Exception as err:
            raise RewardFailed(f"{self._where(problem)}: raised {err!r}") from None
        return self._number(problem, value)

    def _call(self, problem: base.Problem, completion: str) -> Any:
        result = self.function(**self._arguments(problem, completion))
        if inspect.isawaitable(result):
            return asyncio.run(_awaited(result))
        return result

    def _arguments(self, problem: base.Problem, completion: str) -> dict[str, Any]:
        meta: Mapping[str, Any] = problem.meta or {}
        prompt: Any = list(problem.messages) if problem.messages else problem.prompt
        if self.style == "verl":
            return {
                "data_source": meta.get("data_source"),
                "solution_str": completion,
                "ground_truth": problem.answer,
                "extra_info": meta.get("extra_info"),
            }
        if self.style == "trl":
            columns = {k: [v] for k, v in meta.items() if k not in ("prompt", "completions")}
            return {"prompts": [prompt], "completions": [completion], **columns}
        query = problem.prompt + completion
        return {"queries": [query], "prompts": [problem.prompt], "labels": [problem.answer]}

    def _number(self, problem: base.Problem, value: Any) -> float:
        if isinstance(value, Mapping):
            value = value.get("score", value.get("rewards"))
        if self.style != "verl":  # a batch of one
            value = _first(value)
        if value is None:
            raise RewardFailed(f"{self._where(problem)}: not applicable (None)")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RewardFailed(
                f"{self._where(problem)}: returned {value!r}, not a number"
            ) from None
        if not math.isfinite(number):
            raise RewardFailed(f"{self._where(problem)}: returned {number}")
        return number

    def _where(self, problem: base.Problem) -> str:
        return f"reward {self.function.__qualname__} on problem {problem.id}"


async def _awaited(result: Any) -> Any:
    return await result


def _first(value: Any) -> Any:
    if hasattr(value, "tolist"):  # a tensor or an array
        value = value.tolist()
    if isinstance(value, list | tuple):
        return value[0] if value else None
    return value


def make(name: str, *, style: str | None = None, timeout: float = 10.0) -> Reward:
    """The reward `name` names: `exact`, `math` or a user's `module:function`."""
    if name == "exact":
        return exact
    if name == "math":
        return MathReward(timeout=timeout)
    return UserReward(load_function(name), style=style, timeout=timeout)
