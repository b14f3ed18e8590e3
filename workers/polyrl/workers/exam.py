"""The verifier's exam travels from the solver's trainer to the verifier's, through NATS.

The solver's trainer publishes its warm-started greedy answers to the held-out problems
(`evaluation.solver_answers`) once, at step 0, as an object beside its model bundle; the
verifier's trainer waits for them before its own step 0 and judges them at every evaluation
(`evaluation.exam_cases`). The verifier has nothing to judge before the solver answers, so
the wait costs it no samples.
"""

from __future__ import annotations

import json
import logging

from nats.js import JetStreamContext

from polyrl.api.naming import JobNames
from polyrl.workers import bundle

log = logging.getLogger("polyrl.exam")

OBJECT = "exam.json"


async def publish(js: JetStreamContext, names: JobNames, policy: str, answers: list[str]) -> None:
    store = await js.object_store(names.weights_bucket(policy))
    await store.put(OBJECT, json.dumps({"answers": answers}).encode())


async def fetch(
    js: JetStreamContext, names: JobNames, policy: str, *, timeout: float, poll: float = 0.5
) -> list[str] | None:
    """`policy`'s published answers, waiting up to `timeout` seconds; None if none came or
    what came is not a list of answers (logged: the verifier then goes without an exam)."""
    data = await bundle.wait_for_object(js, names, policy, OBJECT, timeout=timeout, poll=poll)
    if data is None:
        log.warning("no exam: %s published no answers in %.0f s", policy, timeout)
        return None
    try:
        answers = json.loads(data)["answers"]
    except (ValueError, KeyError, TypeError) as err:
        log.warning("no exam: %s's answers are malformed: %r", policy, err)
        return None
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        log.warning("no exam: %s's answers are not a list of strings", policy)
        return None
    return answers
