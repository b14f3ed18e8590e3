"""Prompts and verdicts of the solver-verifier workflow, for any task.

The verifier policy sees the solver's problem with its candidate answer appended and a "?"
("12+35=47?") and answers with one character, "y" or "n". Its reward is whether that verdict
agrees with the task's own reward of the candidate, so the verifier learns to judge without
ever seeing the reference answer. One character keeps the verdict unambiguous for a tiny model
and cheap to parse; anything else is no verdict (None), which the workflow scores as wrong.
"""

from __future__ import annotations

from polyrl.workers.tasks import base

YES, NO = "y", "n"


def verify_prompt(problem: base.Problem, candidate: str) -> str:
    """The verifier's prompt: the problem, the candidate's answer text, and "?"."""
    return f"{problem.prompt}{base.answer_text(candidate)}?"


def verify_answer(correct: bool) -> str:
    """The verdict a perfect verifier writes (also the target of a supervised warm-up)."""
    return YES if correct else NO


def parse_verdict(completion: str) -> bool | None:
    """True for "y", False for "n" (the first character after leading spaces), else None."""
    text = completion.lstrip(" ")
    if text.startswith(YES):
        return True
    if text.startswith(NO):
        return False
    return None
