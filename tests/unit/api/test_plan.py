"""plan() decides what runs; it is pure, deterministic and respects scaled groups."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from polyrl.api import naming, plan
from polyrl.api.launch import CONFIG_ENV, Role, WorkerConfig, WorkerLaunch
from polyrl.api.resources import PolicyGroup, RLJob

URL = "nats://nats:4222"


def for_group(result: plan.Plan, group: str) -> list[WorkerLaunch]:
    return [launch for launch in result.launches if launch.policy_group == group]


def job(**spec: Any) -> RLJob:
    doc: dict[str, Any] = {
        "metadata": {"name": "math", "namespace": "team"},
        "spec": {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://s"},
                    "rollout": {"replicas": 2},
                    "trainer": {"replicas": 2, "nprocPerNode": 4},
                },
                {"name": "verifier", "model": {"path": "tiny-llama://v"}, "image": "custom:1"},
            ],
            **spec,
        },
    }
    return RLJob.model_validate(doc)


def test_each_policy_gets_a_policy_group_named_after_job_and_policy() -> None:
    groups = plan.plan(job(), nats_url=URL).policy_groups
    assert [g.metadata.name for g in groups] == ["math-solver", "math-verifier"]
    assert groups[0].spec.job_ref == "math"
    assert groups[0].spec.trainer is not None
    assert groups[0].spec.rollout.replicas == 2


def test_launches_cover_trainers_rollouts_and_workflow_runners_with_stable_names() -> None:
    launches = plan.plan(job(), nats_url=URL).launches
    assert [launch.name for launch in launches] == [
        "math-solver-trainer-0",
        "math-solver-trainer-1",
        "math-solver-rollout-0",
        "math-solver-rollout-1",
        "math-verifier-trainer-0",
        "math-verifier-rollout-0",
        "math-workflow-0",
    ]


def test_ending_or_extending_a_job_by_time_changes_no_pod() -> None:
    """Only the operator reads stop.durationSeconds: editing it must not change any pod's
    config, whose hash would restart the trainers from their checkpoints."""
    plain = plan.plan(job(), nats_url=URL).launches
    timed = plan.plan(job(stop={"durationSeconds": 1}), nats_url=URL).launches
    assert [x.env for x in timed] == [x.env for x in plain]
    stepped = plan.plan(job(stop={"steps": 7}), nats_url=URL).launches
    assert stepped[0].config.spec.stop.steps == 7  # the trainers need their last step


def test_the_plan_is_deterministic() -> None:
    a = plan.plan(job(), nats_url=URL)
    b = plan.plan(job(), nats_url=URL)
    assert [x.to_api() for x in a.launches] == [x.to_api() for x in b.launches]


def test_multi_node_trainers_rendezvous_over_the_headless_service() -> None:
    trainer = for_group(plan.plan(job(), nats_url=URL), "math-solver")[1]
    # `polyrl worker trainer` checks the input without torch, then becomes torchrun.
    assert trainer.command[:5] == ["polyrl", "worker", "trainer", "torchrun", "--nproc-per-node=4"]
    assert "--rdzv-endpoint=$(POLYRL_RDZV_ENDPOINT)" in trainer.command
    assert trainer.env["POLYRL_RDZV_ENDPOINT"] == "math-solver-trainer-0.math-solver-trainer:29400"
    assert trainer.env["POLYRL_NODE_RANK"] == "1"
    single = for_group(plan.plan(job(), nats_url=URL), "math-verifier")[0]
    assert "--standalone" in single.command


def test_the_worker_config_document_carries_role_replica_and_the_whole_spec() -> None:
    rollout = for_group(plan.plan(job(), nats_url=URL), "math-solver")[3]
    config = WorkerConfig.model_validate(json.loads(rollout.env[CONFIG_ENV]))
    assert (config.role, config.policy, config.replica) == (Role.ROLLOUT, "solver", 1)
    assert config.nats_url == URL
    assert config.spec.policies[1].image == "custom:1"
    assert rollout.labels[naming.L_REPLICA] == "1"


def test_images_fall_back_from_group_to_policy_to_job() -> None:
    launches = plan.plan(job(image="job:2"), nats_url=URL).launches
    images = {launch.name: launch.image for launch in launches}
    assert images["math-solver-rollout-0"] == "job:2"
    assert images["math-verifier-rollout-0"] == "custom:1"


def test_launches_follow_scaled_and_user_applied_groups() -> None:
    j = job()
    owned = plan.policy_groups(j)
    scaled = owned[0].model_copy(deep=True)
    scaled.spec.rollout.replicas = 5
    extra = PolicyGroup.model_validate(
        {
            "metadata": {"name": "eu-solver", "namespace": "team"},
            "spec": {
                "jobRef": "math",
                "policy": "solver",
                "rollout": {"replicas": 3},
                "image": "eu:1",
            },
        }
    )
    result = plan.plan(j, nats_url=URL, groups=[scaled, extra])
    assert len([x for x in for_group(result, "math-solver") if x.role == Role.ROLLOUT]) == 5
    eu = for_group(result, "eu-solver")
    assert [x.role for x in eu] == [Role.ROLLOUT] * 3  # no trainer in a capacity group
    assert eu[0].image == "eu:1"


def test_a_group_with_its_own_nats_url_connects_its_pods_there_and_others_to_the_jobs() -> None:
    j = job()
    remote = PolicyGroup.model_validate(
        {
            "metadata": {"name": "eu-solver", "namespace": "team"},
            "spec": {
                "jobRef": "math",
                "policy": "solver",
                "rollout": {"replicas": 2},
                "natsUrl": "tls://nats.eu.example:4222",
            },
        }
    )
    result = plan.plan(j, nats_url=URL, groups=[*plan.policy_groups(j), remote])
    urls = {launch.name: launch.config.nats_url for launch in result.launches}
    assert (
        urls["eu-solver-rollout-0"] == urls["eu-solver-rollout-1"] == "tls://nats.eu.example:4222"
    )
    assert {
        urls["math-solver-rollout-0"],
        urls["math-solver-trainer-0"],
        urls["math-workflow-0"],
    } == {URL}
    with pytest.raises(ValidationError, match="natsUrl"):
        PolicyGroup.model_validate(
            {
                "metadata": {"name": "x"},
                "spec": {"jobRef": "math", "policy": "solver", "natsUrl": "eu:4222"},
            }
        )


def test_a_suspended_job_plans_groups_but_no_pods() -> None:
    result = plan.plan(job(suspend=True), nats_url=URL)
    assert len(result.policy_groups) == 2
    assert result.launches == []


def test_names_that_would_overflow_63_characters_are_refused() -> None:
    with pytest.raises(ValidationError, match="limit is 63"):
        RLJob.model_validate(
            {
                "metadata": {"name": "j" * 45},
                "spec": {"policies": [{"name": "verifier", "model": {"path": "m"}}]},
            }
        )


def test_rollout_bounds_and_duplicate_policies_are_refused_by_the_models_too() -> None:
    with pytest.raises(ValidationError, match="minReplicas <= replicas <= maxReplicas"):
        job(
            policies=[
                {"name": "a", "model": {"path": "m"}, "rollout": {"replicas": 9, "maxReplicas": 3}}
            ]
        )
    with pytest.raises(ValidationError, match="duplicate policy names: a"):
        job(policies=[{"name": "a", "model": {"path": "m"}}, {"name": "a", "model": {"path": "m"}}])


def test_nats_names_are_namespaced_by_job_and_policy() -> None:
    names = naming.JobNames(namespace="team", job="math")
    assert names.requests_subject("solver") == "af.team.math.solver.requests"
    assert names.requests_stream("solver") == "af-team-math-solver-requests"
    assert names.drain_subject("solver", "p-1") == "af.team.math.solver.control.drain.p-1"
    assert naming.active_rollout_selector("g") == (
        "polyrl.dev/policy-group=g,polyrl.dev/role=rollout,!polyrl.dev/draining"
    )


def test_only_the_first_trainer_pod_mounts_the_checkpoint_claim_keyed_by_the_job_uid() -> None:
    owned = job().model_copy(update={"metadata": job().metadata.model_copy(update={"uid": "u-42"})})
    trainers = [x for x in plan.plan(owned, nats_url=URL).launches if x.role == Role.TRAINER]
    first, second = trainers[0], trainers[1]
    assert first.checkpoint_claim == "math-solver-checkpoints"
    assert first.env["POLYRL_TRAINER_DIR"] == "/var/lib/polyrl/u-42"
    assert second.checkpoint_claim is None
    assert "POLYRL_TRAINER_DIR" not in second.env
    solver = owned.spec.policies[0]
    assert plan.checkpoint_output(owned, solver) == (
        "pvc://math-solver-checkpoints/u-42/team/math/solver/checkpoint"
    )


def test_a_policy_can_name_its_own_checkpoint_claim() -> None:
    named = job()
    named.spec.policies[1].trainer.checkpoint.claim_name = "models"
    launches = plan.plan(named, nats_url=URL).launches
    verifier = next(x for x in launches if x.name == "math-verifier-trainer-0")
    assert verifier.checkpoint_claim == "models"
    assert plan.checkpoint_output(named, named.spec.policies[1]).startswith("pvc://models/")


def shared_pool_job() -> RLJob:
    lora = {"rank": 4}
    return RLJob.model_validate(
        {
            "metadata": {"name": "math", "namespace": "team"},
            "spec": {
                "policies": [
                    {"name": "solver", "model": {"path": "tiny-llama://s"},
                     "trainer": {"lora": lora}, "rollout": {"replicas": 2}},
                    {"name": "verifier", "model": {"path": "tiny-llama://s"},
                     "trainer": {"lora": lora},
                     "rollout": {"replicas": 3, "servedBy": "solver"}},
                ]
            },
        }
    )  # fmt: skip


def test_a_policy_served_by_another_policys_pool_gets_a_trainer_and_no_rollout_pods() -> None:
    names = [launch.name for launch in plan.plan(shared_pool_job(), nats_url=URL).launches]
    assert names == [
        "math-solver-trainer-0",
        "math-solver-rollout-0",
        "math-solver-rollout-1",
        "math-verifier-trainer-0",
        "math-workflow-0",
    ]
    groups = plan.plan(shared_pool_job(), nats_url=URL).policy_groups
    assert groups[1].spec.rollout.served_by == "solver"  # what its status will name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p[1]["rollout"].update(servedBy="judge"), "is not another policy"),
        (lambda p: p[1]["rollout"].update(servedBy="verifier"), "is not another policy"),
        (lambda p: p[0]["rollout"].update(servedBy="verifier"), "is itself served by"),
        (lambda p: p[0]["trainer"].pop("lora"), "policy solver needs trainer.lora"),
        (lambda p: p[1]["trainer"].update(lora={"rank": 4, "sync": "merged"}), "sync: adapter"),
        (lambda p: p[0]["model"].update(path="tiny-llama://other"), "holds one base model"),
        (lambda p: p[0]["model"].update(dtype="float32"), "model.dtype"),
    ],
    ids=["missing", "itself", "chain", "no-lora", "merged", "other-model", "other-dtype"],
)
def test_a_servedby_one_engine_cannot_serve_is_refused_naming_why(
    change: Any, message: str
) -> None:
    doc = shared_pool_job().model_dump(by_alias=True, exclude_none=True)
    change(doc["spec"]["policies"])
    with pytest.raises(ValidationError, match=message):
        RLJob.model_validate(doc)
