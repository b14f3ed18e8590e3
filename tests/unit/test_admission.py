"""A queued job's Admitted and Suspended conditions, as the gang's Workload says them."""

from __future__ import annotations

from typing import Any, cast

from polyrl.api import queueing
from polyrl.api.base import ConditionType, find_condition
from polyrl.api.resources import RLJob
from polyrl.operator import admission, podinfo, scaling
from polyrl.operator.context import Context
from polyrl.operator.jobpass import JobReconcile
from polyrl.operator.podinfo import PodInfo

JOB: dict[str, Any] = {
    "metadata": {"name": "math", "namespace": "team", "uid": "u-1"},
    "spec": {"policies": [{"name": "solver", "model": {"path": "tiny-llama://s"}}]},
}


def reconcile(suspend: bool = False) -> JobReconcile:
    job = RLJob.model_validate({**JOB, "spec": {**JOB["spec"], "suspend": suspend}})
    return JobReconcile(ctx=cast(Context, None), body={}, job=job, status=job.status)


def workload(**conditions: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {"type": kind, "status": status, "reason": reason, "message": message}
                for kind, (status, reason, message) in conditions.items()
            ]
        }
    }


def said(p: JobReconcile, kind: ConditionType) -> tuple[str, str, str]:
    found = find_condition(p.status.conditions, kind)
    assert found is not None
    return found.status, found.reason, found.message


def test_a_waiting_job_repeats_kueues_reason_and_an_admitted_one_says_so_once() -> None:
    p = reconcile()
    waiting = "couldn't assign flavors to pod set 1a2b: insufficient unused quota for cpu"
    admission.update(p, workload(QuotaReserved=("False", "Pending", waiting)), queue="q")
    assert said(p, ConditionType.ADMITTED) == ("False", "Pending", waiting)
    assert said(p, ConditionType.SUSPENDED)[0] == "False"
    assert [e[1] for e in p.events] == ["WaitingForAdmission"]
    admitted = workload(
        QuotaReserved=("True", "QuotaReserved", "cq"), Admitted=("True", "Admitted", "by cq")
    )
    admission.update(p, admitted, queue="q")
    admission.update(p, admitted, queue="q")
    assert said(p, ConditionType.ADMITTED) == ("True", "Admitted", "by cq")
    assert [e[1] for e in p.events] == ["WaitingForAdmission", "Admitted"]


def test_an_evicted_job_is_suspended_with_kueues_reason_and_warned_about() -> None:
    p = reconcile()
    admission.update(p, workload(Admitted=("True", "Admitted", "")), queue="q")
    evicted = workload(
        Admitted=("False", "NoReservation", "evicted"),
        QuotaReserved=("False", "Pending", "preempted by a higher priority workload"),
        Evicted=("True", "Preempted", "Preempted to accommodate a workload (UID: x)"),
    )
    admission.update(p, evicted, queue="q")
    assert said(p, ConditionType.SUSPENDED) == (
        "True",
        "Preempted",
        "Preempted to accommodate a workload (UID: x)",
    )
    assert said(p, ConditionType.ADMITTED)[:2] == ("False", "Pending")
    assert p.events[-1][0] == "Warning"


def test_a_job_is_suspended_as_soon_as_kueue_evicts_it_while_its_pods_still_stop() -> None:
    """Kueue keeps the admission (and the quota) until the evicted pods are gone: the job
    says Suspended from the eviction on, and that its pods are stopping."""
    p = reconcile()
    stopping = workload(
        QuotaReserved=("True", "QuotaReserved", "cq"),
        Admitted=("True", "Admitted", "by cq"),
        Evicted=("True", "PodsReadyTimeout", "Exceeded the PodsReady timeout team/math"),
    )
    admission.update(p, stopping, queue="q")
    status, reason, message = said(p, ConditionType.SUSPENDED)
    assert (status, reason) == ("True", "PodsReadyTimeout")
    assert message.endswith("its pods are stopping")
    readmitted = workload(  # Kueue resets Evicted when it reserves quota again
        QuotaReserved=("True", "QuotaReserved", "cq"),
        Admitted=("True", "Admitted", "by cq"),
        Evicted=("False", "QuotaReserved", "Previously: Exceeded the PodsReady timeout"),
    )
    admission.update(p, readmitted, queue="q")
    assert said(p, ConditionType.SUSPENDED)[:2] == ("False", "Running")


def test_a_user_suspension_and_a_missing_workload_each_say_what_they_are() -> None:
    p = reconcile(suspend=True)
    admission.update(p, None, queue="team-queue")
    assert said(p, ConditionType.SUSPENDED)[:2] == ("True", "SuspendedByUser")
    status, reason, message = said(p, ConditionType.ADMITTED)
    assert (status, reason) == ("False", "NoWorkload")
    assert "team-queue" in message


def test_a_user_suspension_starts_a_new_round_so_the_resumed_gang_is_a_new_workload() -> None:
    p = reconcile(suspend=True)
    before = queueing.gang_name(p.job)
    admission.update(p, None, queue="q")
    admission.update(p, None, queue="q")  # still suspended: the same round
    assert p.status.queue_round == 1
    resumed = p.job.model_copy(update={"status": p.status})
    assert queueing.gang_name(resumed) == f"{before}-1"


def rollout(replica: int, *, deleting: bool = False, ready: bool = True) -> PodInfo:
    return PodInfo(
        name=f"g-rollout-{replica}",
        namespace="team",
        uid=f"u{replica}",
        role="rollout",
        replica=replica,
        policy="solver",
        group="g",
        phase="Running",
        ready=ready,
        deleting=deleting,
        draining=False,
        drain_started=None,
        created=f"2026-01-01T00:00:0{replica}Z",
        spec_hash="h",
        problem=None,
    )


def test_a_gang_rollout_is_made_again_under_its_own_index_once_the_old_pod_is_gone() -> None:
    # 2 gang slots, 3 wanted: slot 0 still going away (Kueue evicted it), slot 1 missing
    pods = [rollout(0, deleting=True), rollout(2)]
    assert scaling.queued_indices(pods, desired=3, slots=2) == [1]
    assert scaling.queued_indices([rollout(2)], desired=3, slots=2) == [0, 1]
    # above the gang: the lowest free indices above its slots
    assert scaling.queued_indices([rollout(0), rollout(1)], desired=4, slots=2) == [2, 3]
    assert scaling.queued_indices([rollout(0), rollout(3)], desired=4, slots=1) == [1, 2]


def test_scaling_down_a_queued_pool_takes_the_rollouts_above_the_gang_first() -> None:
    pods = [rollout(0, ready=False), rollout(1), rollout(2), rollout(3)]
    chosen = scaling.queued_victims(pods, 2, slots=2)
    assert sorted(p.replica for p in chosen) == [2, 3]  # not-Ready rollout 0 is the gang's
    assert [p.replica for p in scaling.victims(pods, 1)] == [0]  # unqueued: not-Ready first


def test_a_pod_kueue_stopped_says_so_and_others_do_not() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "t", "namespace": "n", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert not podinfo.from_body(body).stopped_by_queue
    body["status"]["conditions"].append(
        {"type": "TerminationTarget", "status": "True", "reason": "Preempted"}
    )
    assert podinfo.from_body(body).stopped_by_queue


def test_a_workload_kueue_has_not_looked_at_yet_is_queued_not_pending() -> None:
    p = reconcile()
    admission.update(p, workload(), queue="q")
    assert said(p, ConditionType.ADMITTED) == (
        "False",
        "Queued",
        "waiting in LocalQueue q for Kueue to consider it",
    )
