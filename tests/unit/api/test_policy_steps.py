"""A policy's own `trainer.steps`: its budget, the job's end, and why sync mode refuses it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import ValidationError

from polyrl.api.resources import PolicyStatus, RLJobSpec
from polyrl.operator import jobphase


def spec(*, solver: int | None, stop: int | None, mode: str = "async") -> RLJobSpec:
    trainer = {} if solver is None else {"steps": solver}
    return RLJobSpec.model_validate(
        {
            "policies": [
                {"name": "solver", "model": {"path": "tiny-llama://s"}, "trainer": trainer},
                {"name": "verifier", "model": {"path": "tiny-llama://v"}},
            ],
            "algorithm": {"mode": mode},
            "stop": {} if stop is None else {"steps": stop},
        }
    )


def test_a_policy_trains_its_own_steps_and_the_others_the_jobs() -> None:
    job = spec(solver=400, stop=150)
    assert [job.steps_of(p) for p in job.policies] == [400, 150]
    assert job.all_steps() == {"solver": 400, "verifier": 150}


def test_without_stop_steps_a_policy_without_its_own_has_no_budget() -> None:
    job = spec(solver=400, stop=None)
    assert [job.steps_of(p) for p in job.policies] == [400, None]
    assert job.all_steps() is None  # the job then ends by time, or when stopped


def test_own_steps_are_refused_in_sync_mode_saying_why() -> None:
    with pytest.raises(ValidationError, match=r"trainer.steps needs algorithm.mode async"):
        spec(solver=400, stop=150, mode="sync")
    assert spec(solver=None, stop=150, mode="sync").all_steps() == {"solver": 150, "verifier": 150}


def job_pass(job: RLJobSpec, steps: dict[str, int]) -> Any:
    """What `jobphase._steps_done` reads of a reconcile pass: the spec and the policies' steps."""
    policies = [PolicyStatus(name=name, step=step) for name, step in steps.items()]
    return SimpleNamespace(job=SimpleNamespace(spec=job), status=SimpleNamespace(policies=policies))


def test_the_job_ends_once_every_policy_reached_its_own_last_step() -> None:
    job = spec(solver=400, stop=150)
    assert not jobphase._steps_done(job_pass(job, {"solver": 150, "verifier": 150}))
    assert not jobphase._steps_done(job_pass(job, {"solver": 400}))  # the verifier not reported
    done = job_pass(job, {"solver": 400, "verifier": 150})
    assert jobphase._steps_done(done)
    message = jobphase._stop_message(cast(Any, done))
    assert message == "every policy reached its last step (solver 400, verifier 150)"
    same = spec(solver=None, stop=150)
    assert jobphase._stop_message(job_pass(same, {"solver": 150, "verifier": 151})) == (
        "every policy reached step 150"
    )
