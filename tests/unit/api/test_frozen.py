"""Frozen policies (`frozen: true`): what the models refuse, what the plan runs for them
(a publisher, no trainer), what their NATS user may do, and that the job ends without them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from polyrl.api import access, naming, plan
from polyrl.api.launch import Role
from polyrl.api.naming import JobNames
from polyrl.api.resources import PolicyStatus, RLJob
from polyrl.operator import jobphase, natsusers

URL = "nats://nats:4222"
NAMES = JobNames(namespace="team", job="math")


def job(judge: dict[str, Any] | None = None, **spec: Any) -> RLJob:
    judge = {"frozen": True} if judge is None else judge
    return RLJob.model_validate(
        {
            "metadata": {"name": "math", "namespace": "team"},
            "spec": {
                "policies": [
                    {"name": "solver", "model": {"path": "tiny-llama://s"}},
                    {"name": "judge", "model": {"path": "tiny-llama://j"}, **judge},
                ],
                "stop": {"steps": 20},
                **spec,
            },
        }
    )


def test_a_frozen_policys_group_runs_a_publisher_and_rollouts_and_no_trainer() -> None:
    made = plan.plan(job(), nats_url=URL)
    groups = {g.spec.policy: g for g in made.policy_groups}
    assert groups["judge"].spec.trainer is None
    assert groups["judge"].spec.frozen
    assert groups["solver"].spec.trainer is not None
    assert not groups["solver"].spec.frozen
    mine = [x for x in made.launches if x.policy == "judge"]
    assert [(x.name, x.role) for x in mine] == [
        ("math-judge-publisher", Role.PUBLISHER),
        ("math-judge-rollout-0", Role.ROLLOUT),
    ]
    publisher = mine[0]
    assert publisher.command == ["polyrl", "worker", "publisher"]
    assert publisher.checkpoint_claim is None  # it keeps nothing
    assert publisher.config.role == Role.PUBLISHER
    assert publisher.config.policy == "judge"
    assert publisher.labels[naming.L_ROLE] == "publisher"


def test_a_capacity_group_of_a_frozen_policy_adds_rollouts_only() -> None:
    made = job()
    extra = plan.policy_groups(made)[1].model_copy(deep=True)
    extra.metadata.name = "math-judge-west"
    extra.spec.frozen = False  # what a user applies: jobRef, policy, rollout
    launches = plan.group_launches(made, extra, made.spec.policies[1], nats_url=URL)
    assert [x.role for x in launches] == [Role.ROLLOUT]


@pytest.mark.parametrize(
    "trainer",
    [{"lora": {"rank": 4}}, {"warmupSteps": 5}, {"evalEvery": 5}, {"steps": 5}],
    ids=["lora", "warm-up", "evaluation", "steps"],
)
def test_a_frozen_policy_with_trainer_settings_is_refused_naming_them(
    trainer: dict[str, Any],
) -> None:
    with pytest.raises(ValidationError, match="a frozen policy is never trained"):
        job({"frozen": True, "trainer": trainer})


def test_a_job_of_frozen_policies_only_or_in_sync_mode_is_refused() -> None:
    with pytest.raises(ValidationError, match="a job trains at least one policy"):
        RLJob.model_validate(
            {
                "metadata": {"name": "math"},
                "spec": {"policies": [{"name": "j", "frozen": True, "model": {"path": "x"}}]},
            }
        )
    with pytest.raises(ValidationError, match=r"frozen policies need algorithm\.mode async"):
        job(algorithm={"mode": "sync"})


def test_the_job_ends_when_its_trained_policies_reach_their_steps() -> None:
    spec = job().spec
    assert [p.name for p in spec.trained()] == ["solver"]
    assert spec.all_steps() == {"solver": 20}
    assert spec.steps_of(spec.policies[1]) is None
    done = SimpleNamespace(
        job=SimpleNamespace(spec=spec),
        status=SimpleNamespace(policies=[PolicyStatus(name="solver", step=20)]),
    )
    assert jobphase._steps_done(done)  # type: ignore[arg-type]


def test_a_frozen_policy_gets_a_publisher_user_that_writes_only_its_own_bucket() -> None:
    users = list(natsusers.users(job()))
    assert (Role.PUBLISHER, "judge") in users
    assert (Role.TRAINER, "judge") not in users
    grant = access.grant(NAMES, Role.PUBLISHER, "judge", ["solver", "judge"])
    writes = [s for s in grant.publish if s.startswith("$O.")]
    assert writes == [f"$O.{NAMES.weights_bucket('judge')}.>"]
    assert NAMES.weights_subject("judge") in grant.publish
    assert not any("PURGE" in s or "UPDATE" in s for s in grant.publish)  # never prunes
    for other in ("trajectories", "requests"):
        assert not any(other in s for s in grant.publish + grant.subscribe)
    with pytest.raises(ValueError, match="needs one of the job's policies"):
        access.grant(NAMES, Role.PUBLISHER, "critic", ["solver", "judge"])
