"""Which pods of a queued RLJob Kueue admits together, and what puts them in its hands."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from polyrl.api import plan, queueing
from polyrl.api.launch import Role, WorkerLaunch
from polyrl.api.resources import RLJob
from polyrl.operator import render


def job_doc(queue: str | None = "team-queue", **rollout: Any) -> dict[str, Any]:
    labels = {queueing.QUEUE_LABEL: queue} if queue else {}
    return {
        "metadata": {"name": "math", "namespace": "team", "uid": "0123456789ab", "labels": labels},
        "spec": {
            "workflow": {"replicas": 1},
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://s"},
                    "trainer": {"replicas": 2, "resources": {"requests": {"cpu": "4"}}},
                    "rollout": {"replicas": 3, "minReplicas": 1, **rollout},
                },
                {
                    "name": "judge",
                    "frozen": True,
                    "model": {"path": "tiny-llama://j"},
                    "rollout": {"replicas": 1, "minReplicas": 1},
                },
            ],
        },
    }


def launches(job: RLJob) -> list[WorkerLaunch]:
    return plan.plan(job, nats_url="nats://n:4222").launches


def pods(job: RLJob) -> dict[str, dict[str, Any]]:
    return {x.name: render.pod(x, namespace="team", owner={}, job=job) for x in launches(job)}


def test_a_queued_jobs_gang_is_its_runners_trainers_publishers_and_minimum_rollouts() -> None:
    job = RLJob.model_validate(job_doc())
    rendered = pods(job)
    gang = {n for n, p in rendered.items() if queueing.GROUP_LABEL in p["metadata"]["labels"]}
    extra = set(rendered) - gang
    assert len(gang) == queueing.gang_size(job) == 1 + 2 + 1 + 1 + 1
    assert [launch.replica for launch in launches(job) if launch.name in extra] == [1, 2]
    for name, pod in rendered.items():
        meta = pod["metadata"]
        assert meta["labels"][queueing.QUEUE_LABEL] == "team-queue"  # every pod waits
        if name in gang:
            assert meta["labels"][queueing.GROUP_LABEL] == "math-01234567"
            assert meta["annotations"][queueing.TOTAL_ANNOTATION] == "6"
        else:  # each rollout above the minimum is a Workload of its own
            assert queueing.TOTAL_ANNOTATION not in meta["annotations"]


def test_a_job_without_a_queue_label_gets_no_kueue_metadata_and_keeps_its_requests() -> None:
    queued, plain = RLJob.model_validate(job_doc()), RLJob.model_validate(job_doc(None))
    for launch in launches(plain):
        pod = render.pod(launch, namespace="team", owner={}, job=plain)
        assert not any(k.startswith("kueue.x-k8s.io") for k in pod["metadata"]["labels"])
        assert pod == render.pod(launch, namespace="team", owner={})
    runner = next(x for x in launches(queued) if x.role == Role.WORKFLOW)
    requests = render.pod(runner, namespace="team", owner={}, job=queued)["spec"]["containers"][0][
        "resources"
    ]["requests"]
    assert requests == queueing.DEFAULT_REQUESTS  # none asked: quota must bind all the same
    trainer = next(x for x in launches(queued) if x.role == Role.TRAINER)
    container = render.pod(trainer, namespace="team", owner={}, job=queued)["spec"]["containers"]
    assert container[0]["resources"]["requests"] == {"cpu": "4"}


def test_a_priority_class_label_on_the_job_reaches_every_pod() -> None:
    doc = job_doc()
    doc["metadata"]["labels"][queueing.PRIORITY_LABEL] = "high"
    job = RLJob.model_validate(doc)
    for pod in pods(job).values():
        assert pod["metadata"]["labels"][queueing.PRIORITY_LABEL] == "high"


def test_another_regions_group_for_a_policy_adds_capacity_outside_the_gang() -> None:
    job = RLJob.model_validate(job_doc())
    [group] = [g for g in plan.policy_groups(job) if g.spec.policy == "solver"]
    remote = group.model_copy(deep=True)
    remote.metadata.name = "math-solver-eu"
    policy = job.spec.policy("solver")
    assert policy is not None
    for launch in plan.group_launches(job, remote, policy, nats_url="nats://n"):
        if launch.role == Role.ROLLOUT:
            assert not queueing.in_gang(job, launch)


def test_podsets_are_counted_by_shape_and_a_job_needing_more_than_kueue_allows_is_refused() -> None:
    job = RLJob.model_validate(job_doc())
    gang = [
        queueing.with_default_requests(job, x) for x in launches(job) if queueing.in_gang(job, x)
    ]
    # runner, publisher and rollouts share the default shape; the trainer has its own
    assert queueing.podset_count(gang) == 2
    assert queueing.refusal(job) is None
    doc = job_doc()
    base = doc["spec"]["policies"][0]
    doc["spec"]["policies"] = []
    for i in range(5):
        policy = copy.deepcopy(base)
        policy["name"] = f"p{i}"
        policy["trainer"]["resources"] = {"requests": {"cpu": str(i + 1)}}
        policy["rollout"]["resources"] = {"requests": {"cpu": str(i + 10)}}
        doc["spec"]["policies"].append(policy)
    refused = queueing.refusal(RLJob.model_validate(doc))
    assert refused is not None
    assert "11 Kueue PodSets" in refused
    assert "at most 8" in refused


@pytest.mark.parametrize(
    ("gates", "expected"),
    [([], False), ([{"name": queueing.ADMISSION_GATE}], True), ([{"name": "other"}], False)],
)
def test_a_pod_is_held_only_by_kueues_gate(gates: list[dict[str, str]], expected: bool) -> None:
    assert queueing.gated({"spec": {"schedulingGates": gates}}) is expected
