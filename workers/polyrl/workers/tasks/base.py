"""What every task is to the rest of the system: problems to sample, and an exact reward.

A workflow runner only needs three things from a task: a training problem (`sample`), a score for
a completion (`reward`), and a fixed evaluation set (`held_out`). `Task` is a structural
`Protocol`, so a user's task (a `module:function` entry point) needs no import from polyrl.

The held-out split is generated from its own seed and excluded from training sampling, so an
evaluation on it measures generalisation rather than recall. `GeneratedTask` implements that once
for generators that draw problems at random; it caps the split at half of the problem space, so
a small space (one-digit addition has 100 problems) keeps problems to train on.

Rewards are exact (1.0 or 0.0): the answer text is what the completion says up to its first
newline or end-of-sequence marker; tasks may cut it further (arithmetic stops at a space).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import importlib
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast, runtime_checkable

# Tokens a decoded completion may still carry when special tokens were not skipped.
_END_MARKERS = ("</s>", "<pad>")
MAX_SAMPLE_ATTEMPTS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """One problem: the prompt the policy continues, a reference answer, a stable id."""

    prompt: str
    answer: str
    id: str
    messages: tuple[Mapping[str, str], ...] | None = None
    """A chat prompt (a dataset row's messages): sent as messages, through the policy's chat
    template; `prompt` then holds the last user message's text, for logs."""
    meta: Mapping[str, Any] | None = None
    """The row's other columns (data_source, extra_info, ...), for reward functions."""

    @property
    def request(self) -> str | list[Mapping[str, str]]:
        """What to ask a policy with: the messages where there are some, else the text."""
        return list(self.messages) if self.messages else self.prompt


@runtime_checkable
class Task(Protocol):
    """A source of problems with an exact reward; see the module docstring."""

    @property
    def name(self) -> str: ...

    def sample(self, rng: random.Random) -> Problem: ...

    def reward(self, problem: Problem, completion: str) -> float: ...

    def held_out(self) -> list[Problem]: ...


def problem_id(task_name: str, prompt: str) -> str:
    """The same prompt is the same problem: ids are derived from it, stable across processes."""
    digest = hashlib.sha256(f"{task_name}\0{prompt}".encode()).hexdigest()
    return f"{task_name}-{digest[:16]}"


def answer_text(completion: str) -> str:
    """The completion up to its first newline or end marker, without surrounding whitespace."""
    end = len(completion)
    for marker in ("\n", *_END_MARKERS):
        found = completion.find(marker)
        if found != -1:
            end = min(end, found)
    return completion[:end].strip()


class GeneratedTask(abc.ABC):
    """A task whose problems come from a random generator; implements the held-out split.

    Subclasses set their own parameters before calling `__init__`, which draws the split.
    """

    def __init__(self, *, held_out: int, seed: int) -> None:
        if held_out < 0:
            raise ValueError(f"task {self.name}: held_out must be >= 0, got {held_out}")
        count = min(held_out, self.space_size() // 2)
        self._held_out = self._draw_unique(random.Random(f"{self.name}/held-out/{seed}"), count)
        self._held_out_ids = frozenset(problem.id for problem in self._held_out)

    @property
    @abc.abstractmethod
    def name(self) -> str: ...

    @abc.abstractmethod
    def space_size(self) -> int:
        """How many distinct problems the generator can produce (a lower bound will do)."""

    @abc.abstractmethod
    def generate(self, rng: random.Random) -> Problem:
        """One problem drawn from the whole space, held-out or not."""

    @abc.abstractmethod
    def reward(self, problem: Problem, completion: str) -> float: ...

    def held_out(self) -> list[Problem]:
        return list(self._held_out)

    def sample(self, rng: random.Random) -> Problem:
        # At most half the space is held out, so each draw succeeds with probability >= 1/2
        # (for a uniform generator) and running out of attempts means a broken generator.
        for _ in range(MAX_SAMPLE_ATTEMPTS):
            problem = self.generate(rng)
            if problem.id not in self._held_out_ids:
                return problem
        raise RuntimeError(
            f"task {self.name}: {MAX_SAMPLE_ATTEMPTS} draws in a row were held-out problems"
        )

    def _draw_unique(self, rng: random.Random, count: int) -> list[Problem]:
        problems: dict[str, Problem] = {}
        # Generators need not be uniform; a generous budget still ends on a degenerate one.
        for _ in range(count * 50):
            if len(problems) == count:
                break
            problem = self.generate(rng)
            problems.setdefault(problem.id, problem)
        return list(problems.values())


Params = dict[str, int | float | str | bool]


def check_known(task_name: str, params: Params, known: set[str]) -> None:
    """Refuse parameters a task does not read: a typo must not silently mean the default."""
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"task {task_name}: unknown params {unknown}; it accepts {sorted(known)}")


def int_param(task_name: str, params: Params, key: str, default: int, low: int, high: int) -> int:
    """An integer parameter within [low, high]."""
    value = params.get(key, default)
    # bool is an int subclass; `digits: true` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(
            f"task {task_name}: param {key} must be an integer in [{low}, {high}], got {value!r}"
        )
    return value


def near_miss(problem: Problem, rng: random.Random, *, at: int = -1) -> str:
    """A wrong answer close to the right one: its character at `at` (the last) changed.

    A digit becomes another digit. This is the default; a task with a `near_miss(problem, rng)`
    method of its own (arithmetic, whose answers may be written reversed) picks the position.
    """
    answer = problem.answer
    at %= len(answer)
    old = answer[at]
    if old.isdigit():
        replacement = str((int(old) + rng.randint(1, 9)) % 10)
    else:
        replacement = "0" if old != "0" else "1"
    return answer[:at] + replacement + answer[at + 1 :]


def entry_point(name: str, *, what: str, builtins: Sequence[str]) -> Callable[..., Any]:
    """The callable a `module:function` names; ValueError naming `what` and the cause."""
    module_name, colon, attribute = name.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(
            f"unknown {what} {name!r}: use one of {sorted(builtins)} or a `module:function` "
            "entry point"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{what} {name!r}: cannot import {module_name!r}: {error}") from None
    found: Any = getattr(module, attribute, None)
    if not callable(found):
        raise ValueError(
            f"{what} entry point {name!r}: {module_name} has no callable {attribute!r}"
        )
    return cast(Callable[..., Any], found)
