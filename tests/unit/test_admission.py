"""A queued job's Admitted and Suspended conditions, as the gang's Workload says them."""

from __future__ import annotations

from typing import Any, cast

from polyrl.api.base import ConditionType, find_condition
from polyrl.api.resources import RLJob
from polyrl.operator import admission
from polyrl.operator.context import Context
from polyrl.operator.jobpass import JobReconcile

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


def test_a_user_suspension_and_a_missing_workload_each_say_what_they_are() -> None:
    p = reconcile(suspend=True)
    admission.update(p, None, queue="team-queue")
    assert said(p, ConditionType.SUSPENDED)[:2] == ("True", "SuspendedByUser")
    status, reason, message = said(p, ConditionType.ADMITTED)
    assert (status, reason) == ("False", "NoWorkload")
    assert "team-queue" in message


def test_a_user_suspension_starts_a_new_round_so_the_resumed_gang_is_a_new_workload() -> None:
    from polyrl.api import queueing

    p = reconcile(suspend=True)
    before = queueing.gang_name(p.job)
    admission.update(p, None, queue="q")
    admission.update(p, None, queue="q")  # still suspended: the same round
    assert p.status.queue_round == 1
    resumed = p.job.model_copy(update={"status": p.status})
    assert queueing.gang_name(resumed) == f"{before}-1"
