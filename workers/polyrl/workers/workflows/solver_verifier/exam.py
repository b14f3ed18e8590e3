"""The verifier's exam: the warm-started solver's own answers to held-out problems.

The solver's trainer answers `EXAM_PROBLEMS` held-out problems greedily once, after its warm
start (a resumed trainer does not), and hands the answers over (`workflows.interface.Handoff`: an object
beside its weights in NATS); the verifier's trainer waits for them before its step 0 and
judges the same answers at every evaluation. They are the solver's own kind of mistakes,
which RL trains the verifier on (the held-out near misses are synthetic), and unlike the
answers judged during RL (`judging`) they do not change as the solver learns, so a rise in
the verifier's figure on them is the judge's own. The verifier has nothing to judge before
the solver answers, so the wait costs it no samples.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from polyrl.workers.tasks import base
from polyrl.workers.workflows.solver_verifier import verdicts

log = logging.getLogger("polyrl.exam")

OBJECT = "exam.json"
EXAM_PROBLEMS = 500
TIMEOUT_SECONDS = 600.0


def problems(task: base.Task) -> list[base.Problem]:
    return task.held_out()[:EXAM_PROBLEMS]


def encode(answers: Sequence[str]) -> bytes:
    return json.dumps({"answers": list(answers)}).encode()


def decode(data: bytes | None, solver: str) -> list[str] | None:
    """The solver's answers, or None if none came or what came is malformed (logged: the
    verifier then goes without an exam)."""
    if data is None:
        log.warning("no exam: %s published no answers in time", solver)
        return None
    try:
        answers = json.loads(data)["answers"]
    except (ValueError, KeyError, TypeError) as err:
        log.warning("no exam: %s's answers are malformed: %r", solver, err)
        return None
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        log.warning("no exam: %s's answers are not a list of strings", solver)
        return None
    return answers


def cases(judge: verdicts.VerificationTask, answers: Sequence[str]) -> list[base.Problem]:
    """The exam's problems with `answers` as candidates, each right or wrong by the task."""
    return [judge.case(p, a) for p, a in zip(problems(judge.task), answers, strict=False)]
