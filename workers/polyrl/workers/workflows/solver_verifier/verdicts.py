"""Prompts and verdicts of the solver-verifier workflow, for any task.

The verifier policy sees the solver's problem with its candidate answer appended and a "?"
("12+35=47?"). It first writes its own working, the answer it computes, and then a one-character
verdict, "y" or "n" ("47y"). Its reward is whether that verdict agrees with the task's own
reward of the candidate, so the verifier learns to judge without ever seeing the reference
answer. The verdict is the completion's last character; anything else there is no verdict
(None), which the workflow scores as wrong.

Why the working: a verdict written straight after the candidate gives a small model no
gradient to start from. For addition, "y" depends on the ones digits of both operands and of the
candidate only jointly, like a parity, so no single token carries any signal. A fresh tiny
Llama trained on such verdicts stayed at exactly ln 2 per verdict for 1,600 supervised steps,
even after it had learnt to add. With the working first, the working is supervised like the
solver's answer, and the verdict becomes a comparison of characters the model has just written.
The same model reached 0.91-0.95 balanced accuracy in 600 steps of 128
(`scripts/verifier_format.py`). The working is the task's reference answer, so this works for
any task. What it does not stop is copying: where near misses differ from the answer in one
digit only, the candidate's other digits are always right, and the quick start's verifier
learnt to copy them into its working rather than compute them (`docs/benchmarks.md`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from polyrl.api.resources import RLJobSpec
from polyrl.api.verifier import VerifierSpec
from polyrl.workers.tasks import base

YES, NO = "y", "n"
VERDICT_TOKENS = 1  # the verdict's room after the working, which is as long as an answer
CHAT_VERDICT_TOKENS = 16  # a chat verifier's room for its verdict line, by default
Request = str | list[dict[str, str]]


class Verdicts(Protocol):
    """How the verifier is asked about a candidate, what a right verifier writes, and how
    its verdict is read: the built-in characters, or a job's chat template."""

    def prompt(self, problem: base.Problem, candidate: str) -> Request: ...

    def target(self, right: bool, working: str) -> str: ...

    def parse(self, completion: str) -> bool | None: ...

    def budget(self, answer_tokens: int) -> int: ...


class CharVerdicts:
    """The built-in format: "12+35=47?", then the working and "y" or "n" (see above)."""

    def prompt(self, problem: base.Problem, candidate: str) -> Request:
        return verify_prompt(problem, candidate)

    def target(self, right: bool, working: str) -> str:
        return verify_answer(right, working)

    def parse(self, completion: str) -> bool | None:
        return parse_verdict(completion)

    def budget(self, answer_tokens: int) -> int:
        return verifier_max_new_tokens(answer_tokens)


@dataclass(frozen=True)
class ChatVerdicts:
    """A job's `workflow.verifier`: chat messages in, a verdict word read with a pattern."""

    spec: VerifierSpec

    def prompt(self, problem: base.Problem, candidate: str) -> Request:
        return self.spec.prompt(problem=problem.prompt, candidate=base.answer_text(candidate))

    def target(self, right: bool, working: str) -> str:
        return self.spec.render(working=working, verdict=right)

    def parse(self, completion: str) -> bool | None:
        return self.spec.parse(completion)

    def budget(self, answer_tokens: int) -> int:
        return self.spec.max_new_tokens or answer_tokens + CHAT_VERDICT_TOKENS


CHARS = CharVerdicts()


def of(spec: RLJobSpec) -> Verdicts:
    """The job's verdict format: its `workflow.verifier`, or the built-in characters."""
    verifier = spec.workflow.verifier
    return CHARS if verifier is None else ChatVerdicts(verifier)


def verifier_max_new_tokens(answer_tokens: int) -> int:
    """The verifier's generation budget: the room of a solver's answer, then the verdict."""
    return answer_tokens + VERDICT_TOKENS


def verify_prompt(problem: base.Problem, candidate: str) -> str:
    """The verifier's prompt: the problem, the candidate's answer text, and "?"."""
    return f"{problem.prompt}{base.answer_text(candidate)}?"


def verify_answer(correct: bool, working: str = "") -> str:
    """What a perfect verifier writes (the target of its supervised warm-up): the working,
    which is the problem's reference answer, then the verdict."""
    return working + (YES if correct else NO)


def parse_verdict(completion: str) -> bool | None:
    """True for "y", False for "n" as the last character of the answer text, else None.

    Whatever working comes before the verdict does not matter: the verdict is what is judged.
    """
    text = base.answer_text(completion)
    if text.endswith(YES):
        return True
    if text.endswith(NO):
        return False
    return None


def verdict_reward(said: bool | None, right: bool) -> float:
    """The verifier's reward: 1 for a verdict that agrees with the truth; no verdict is wrong."""
    return 1.0 if said is not None and said == right else 0.0


def truth(judged: base.Problem) -> bool:
    """Whether a verification problem's candidate is right (`VerificationTask.case` says)."""
    if judged.meta is not None and "right" in judged.meta:
        return bool(judged.meta["right"])
    return judged.answer.endswith(YES)


class VerificationTask:
    """The verifier's own task: a problem with a candidate answer, worked and judged.

    Candidates are right half of the time and near misses otherwise, so always answering one
    way is worth exactly half; used for the verifier's supervised warm start (which teaches
    the verdict format and a first sense of right and wrong) and for its evaluation.
    """

    def __init__(self, task: base.Task, verdicts: Verdicts = CHARS) -> None:
        self.task, self.verdicts = task, verdicts

    @property
    def name(self) -> str:
        return f"verify-{self.task.name}"

    def judged(self, problem: base.Problem, right: bool, rng: random.Random) -> base.Problem:
        miss = getattr(self.task, "near_miss", None) or base.near_miss
        candidate = problem.answer if right else miss(problem, rng)
        if not right and self.task.reward(problem, candidate) > 0.5:
            candidate, right = problem.answer, True  # the near miss happened to be right too
        return self.case(problem, candidate)

    def case(self, problem: base.Problem, candidate: str) -> base.Problem:
        """`candidate` shown for judging, with the worked verdict the task's check gives it."""
        right = self.task.reward(problem, candidate) > 0.5
        request = self.verdicts.prompt(problem, candidate)
        text = request if isinstance(request, str) else request[-1]["content"]
        return base.Problem(
            prompt=text,
            answer=self.verdicts.target(right, problem.answer),
            id=base.problem_id(self.name, text),
            messages=None if isinstance(request, str) else tuple(request),
            meta={"right": right},
        )

    def sample(self, rng: random.Random) -> base.Problem:
        return self.judged(self.task.sample(rng), rng.random() < 0.5, rng)

    def reward(self, problem: base.Problem, completion: str) -> float:
        return verdict_reward(self.verdicts.parse(completion), truth(problem))

    def held_out(self) -> list[base.Problem]:
        """Each held-out problem of the task twice: with its answer and with a near miss."""
        rng = random.Random(0)
        out = []
        for problem in self.task.held_out():
            out += [self.judged(problem, True, rng), self.judged(problem, False, rng)]
        return out
