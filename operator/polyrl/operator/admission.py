"""A queued RLJob's admission by Kueue, as its status says it: `Admitted` and `Suspended`.

Kueue decides; the operator only reads the gang's Workload (`polyrl.api.queueing`: the pod
group named for the job) and repeats what it says, with Kueue's own reason and message, so
`kubectl describe rljob` tells a user why a job waits ("couldn't assign flavors to pod set
...: insufficient unused quota ...") without reading Kueue's objects. A job that is not
queued gets neither condition.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from polyrl.api import queueing
from polyrl.api.base import ConditionType, find_condition
from polyrl.api.resources import RLJob
from polyrl.operator.jobpass import JobReconcile
from polyrl.operator.kube import Kube
from polyrl.operator.podinfo import PodInfo

NO_WORKLOAD = (
    "Kueue has made no Workload for the job's pods yet (its pods wait behind the "
    f"{queueing.ADMISSION_GATE} gate; is Kueue installed, managing this namespace, with the "
    "LocalQueue {queue}?)"
)


async def observe(p: JobReconcile) -> None:
    """Read the gang's Workload and set the job's conditions from it."""
    queue = queueing.queue_name(p.job)
    if queue is None:
        return
    if (refused := queueing.refusal(p.job)) is not None:
        p.condition(ConditionType.ADMITTED, False, "TooManyPodSets", refused)
        return
    workload = await p.ctx.kube.read_workload(p.ns, queueing.gang_name(p.job))
    update(p, workload, queue=queue)


async def release(kube: Kube, job: RLJob | None, pods: Sequence[PodInfo]) -> None:
    """Before a queued job's pods are freed for good: mark their group not retriable, so
    Kueue finishes its Workload and releases its quota once none of them runs."""
    if job is None or queueing.queue_name(job) is None:
        return
    patch = {"metadata": {"annotations": {queueing.RETRIABLE_ANNOTATION: "false"}}}
    for pod in pods:
        if not pod.deleting:
            with contextlib.suppress(ApiException):  # gone meanwhile: nothing to release
                await kube.patch_pod(job.metadata.namespace, pod.name, patch)


async def let_go(kube: Kube, job: RLJob | None, pods: Sequence[PodInfo]) -> None:
    """Drop Kueue's finalizer from a queued job's pods that ended while being deleted (Kueue
    evicted them, or the operator freed them). Kueue keeps an ended pod of a group until a
    replacement exists, to count it; the operator replaces a pod under the same name (a
    trainer's rank, a runner's), which cannot exist while the ended one does: without this,
    neither would ever move."""
    if job is None or queueing.queue_name(job) is None:
        return
    for pod in pods:
        if pod.deleting and pod.terminal and queueing.FINALIZER in pod.finalizers:
            at = f"/metadata/finalizers/{pod.finalizers.index(queueing.FINALIZER)}"
            patch = [  # a JSON patch: a strategic merge patch cannot take from a list
                {"op": "test", "path": at, "value": queueing.FINALIZER},
                {"op": "remove", "path": at},
            ]
            with contextlib.suppress(ApiException):  # gone, or changed meanwhile: next pass
                await kube.patch_pod(pod.namespace, pod.name, patch)


def update(p: JobReconcile, workload: dict[str, Any] | None, *, queue: str) -> None:
    """Admitted and Suspended from the Workload (None: Kueue has made none yet)."""
    before = find_condition(p.status.conditions, ConditionType.ADMITTED)
    was_admitted = before is not None and before.status == "True"
    if p.job.spec.suspend:
        said = find_condition(p.status.conditions, ConditionType.SUSPENDED)
        if said is None or said.reason != "SuspendedByUser":  # a new round when resumed
            p.status.queue_round += 1
        p.condition(ConditionType.SUSPENDED, True, "SuspendedByUser", "spec.suspend is true")
    if workload is None:
        p.condition(ConditionType.ADMITTED, False, "NoWorkload", NO_WORKLOAD.format(queue=queue))
        if not p.job.spec.suspend:
            p.condition(ConditionType.SUSPENDED, False, "Running", "not suspended")
    else:
        _from_workload(p, workload, queue=queue)
    now = find_condition(p.status.conditions, ConditionType.ADMITTED)
    assert now is not None
    if before is None or (now.status == "True") != was_admitted:
        if now.status == "True":
            p.event("Normal", "Admitted", f"Kueue admitted the job: {now.message}")
        else:
            kind = "Warning" if was_admitted else "Normal"
            p.event(kind, "WaitingForAdmission", f"Kueue: {now.reason}: {now.message}")


def _from_workload(p: JobReconcile, workload: dict[str, Any], *, queue: str) -> None:
    said = {c["type"]: c for c in workload.get("status", {}).get("conditions") or []}
    admitted = said.get("Admitted", {})
    if admitted.get("status") == "True":
        p.condition(ConditionType.ADMITTED, True, admitted.get("reason") or "Admitted",
                    admitted.get("message", ""))  # fmt: skip
    elif (quota := said.get("QuotaReserved")) is not None:
        reason = quota.get("reason") or "Pending"
        message = quota.get("message") or f"waiting in LocalQueue {queue}"
        p.condition(ConditionType.ADMITTED, False, reason, message)
    else:  # made, not yet looked at by Kueue's scheduler
        message = f"waiting in LocalQueue {queue} for Kueue to consider it"
        p.condition(ConditionType.ADMITTED, False, "Queued", message)
    evicted = said.get("Evicted", {})
    if not p.job.spec.suspend:
        # Evicted from the moment Kueue decides (admission, and its quota, stay until the
        # pods are gone); Kueue clears it when it reserves quota again.
        if evicted.get("status") == "True":
            stopping = "; its pods are stopping" if admitted.get("status") == "True" else ""
            p.condition(ConditionType.SUSPENDED, True, evicted.get("reason") or "Evicted",
                        evicted.get("message", "") + stopping)  # fmt: skip
        else:
            p.condition(ConditionType.SUSPENDED, False, "Running", "not suspended")
