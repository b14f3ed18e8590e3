"""A PolicyGroup's rollout pool: pods created to its replicas, failed ones replaced with
backoff, spec changes rolled out one pod at a time, and scale-down drain-first
(`scaling.victims`): a draining pod is told over NATS to stop pulling, and deleted once it
says it drained or its drain timeout passes.
"""

from __future__ import annotations

import time
from typing import Any

from polyrl.api import naming, plan, queueing
from polyrl.api.base import (
    ConditionStatus,
    ConditionType,
    find_condition,
    seconds_since,
)
from polyrl.api.launch import Role, WorkerLaunch
from polyrl.operator import (
    grouppass,
    metrics,
    scaling,
)
from polyrl.operator.grouppass import GroupReconcile
from polyrl.operator.podinfo import PodInfo


async def run(p: GroupReconcile, launches: list[WorkerLaunch]) -> None:
    pods = [x for x in p.pods if x.role == Role.ROLLOUT.value]
    template = launches[0] if launches else _template(p)
    await _replace_terminal(p, [x for x in pods if x.terminal and not x.deleting])
    await _finish_drains(p, [x for x in pods if x.draining and not x.deleting and not x.terminal])
    active = [x for x in pods if x.active]
    desired = _desired(p)
    slots = _gang_slots(p)
    if len(active) > desired:
        chosen = (
            scaling.queued_victims(active, len(active) - desired, slots)
            if slots is not None
            else scaling.victims(active, len(active) - desired)
        )
        for victim in chosen:
            await _start_drain(p, victim, "ScaledDown")
    elif len(active) < desired:
        if scaling.backoff_over(p.status.last_failure_time, p.status.rollout_failures):
            await _scale_up(p, template, pods, desired - len(active), slots)
    else:
        await _roll_one(p, template, active, pods)
    _rollout_status(p, [x for x in active if x.name not in p.leaving])


def served_by(p: GroupReconcile) -> str | None:
    """The policy whose rollout pool serves this group's policy (`rollout.servedBy`, as the
    job says), or None: the group then has no rollout pods whatever its replicas."""
    policy = p.job.spec.policy(p.group.spec.policy) if p.job is not None else None
    return policy.rollout.served_by if policy is not None else None


def _desired(p: GroupReconcile) -> int:
    return 0 if served_by(p) else p.group.spec.rollout.replicas


def _gang_slots(p: GroupReconcile) -> int | None:
    """A queued job's group: how many of its first rollout indices are in the Kueue gang
    (`polyrl.api.queueing`); None where the job is not queued."""
    if p.job is None or queueing.queue_name(p.job) is None:
        return None
    return queueing.gang_rollouts(p.job, p.name)


def _template(p: GroupReconcile) -> WorkerLaunch:
    assert p.job is not None
    policy = p.job.spec.policy(p.group.spec.policy)
    assert policy is not None
    return plan.rollout_template(
        p.job,
        p.group,
        policy,
        nats_url=p.ctx.hub.url_of(p.job),
        entrypoints=p.ctx.settings.entrypoints,
    )


def _rollout_body(p: GroupReconcile, template: WorkerLaunch, replica: int) -> dict[str, Any]:
    return grouppass.render_pod(
        p, template.with_replica(replica, naming.rollout_pod(p.name, replica))
    )


async def _replace_terminal(p: GroupReconcile, pods: list[PodInfo]) -> None:
    for pod in pods:
        await p.ctx.kube.delete_pod(p.namespace, pod.name, pod.uid)
        p.leaving.add(pod.name)
        if pod.phase == "Failed" and not pod.draining:
            p.status.rollout_failures += 1
            grouppass.record_failure(p, pod)
            p.event("Warning", "RolloutPodFailed", f"{p.status.last_failure}; replacing it")


async def _scale_up(
    p: GroupReconcile,
    template: WorkerLaunch,
    pods: list[PodInfo],
    count: int,
    slots: int | None = None,
) -> None:
    used = [x.replica for x in pods if x.name not in p.leaving or not x.terminal]
    if slots is None:
        indices = scaling.free_indices(used, count)
    else:
        staying = [x for x in pods if x.name not in p.leaving or not x.terminal]
        indices = scaling.queued_indices(staying, _desired(p), slots)
    made = 0
    for replica in indices:
        if await p.ctx.kube.create_pod(_rollout_body(p, template, replica)):
            made += 1
    p.created += count
    if made:
        p.event("Normal", "ScaledUp", f"created {made} rollout pod(s)")


async def _roll_one(
    p: GroupReconcile, template: WorkerLaunch, active: list[PodInfo], pods: list[PodInfo]
) -> None:
    """Replace outdated pods one at a time, drain-first (the replacement starts at once)."""
    if any(x.draining for x in pods):
        return
    for pod in sorted(active, key=lambda x: x.replica):
        if pod.spec_hash != grouppass.spec_hash_of(_rollout_body(p, template, pod.replica)):
            await _start_drain(p, pod, "SpecChanged")
            return


async def _start_drain(p: GroupReconcile, pod: PodInfo, why: str) -> None:
    if not grouppass.has_served(p, pod.name):
        # Nothing to drain: it never pulled a request (one it did not answer would come back
        # to the queue anyway), and it may not listen for drain requests yet.
        await p.ctx.kube.delete_pod(p.namespace, pod.name, pod.uid)
        p.leaving.add(pod.name)
        metrics.DRAINS.labels(outcome="never-served").inc()
        p.event(
            "Normal", "Deleted", f"deleted rollout pod {pod.name} at once ({why}): it never served"
        )
        return
    patch = {
        "metadata": {
            "labels": {naming.L_DRAINING: "true"},
            "annotations": {naming.A_DRAIN_STARTED: f"{time.time():.3f}"},
        }
    }
    await p.ctx.kube.patch_pod(p.namespace, pod.name, patch)
    p.leaving.add(pod.name)
    p.event("Normal", "Draining", f"draining rollout pod {pod.name} ({why})")
    await _request_drain(p, pod)


async def _request_drain(p: GroupReconcile, pod: PodInfo) -> None:
    assert p.job is not None
    p.ctx.drain_requested.add((p.namespace, pod.name))
    await p.ctx.hub.request_drain(
        p.job, p.group.spec.policy, pod.name, float(p.group.spec.rollout.drain_timeout_seconds)
    )


async def _finish_drains(p: GroupReconcile, pods: list[PodInfo]) -> None:
    assert p.job is not None
    channel = p.ctx.hub.channel(p.namespace, p.job.metadata.name)
    timeout = p.group.spec.rollout.drain_timeout_seconds
    for pod in pods:
        drained = channel is not None and pod.name in channel.drained
        overdue = time.time() - (pod.drain_started or 0.0) >= timeout
        if drained or overdue:
            await p.ctx.kube.delete_pod(p.namespace, pod.name, pod.uid)
            p.leaving.add(pod.name)
            metrics.DRAINS.labels(outcome="drained" if drained else "timeout").inc()
            p.event(
                "Normal" if drained else "Warning",
                "Drained" if drained else "DrainTimeout",
                f"rollout pod {pod.name} "
                + ("drained; deleted" if drained else f"did not drain within {timeout}s; deleted"),
            )
            if channel is not None:
                channel.drained.pop(pod.name, None)
        elif (p.namespace, pod.name) not in p.ctx.drain_requested:
            await _request_drain(p, pod)  # the operator restarted mid-drain: ask again


def _rollout_status(p: GroupReconcile, active: list[PodInfo]) -> None:
    desired = _desired(p)
    p.status.replicas = len(active) + p.created
    p.status.ready_replicas = sum(1 for x in active if x.ready)
    p.status.selector = naming.active_rollout_selector(p.name)
    p.status.served_by = served_by(p)
    problem = next((x.problem for x in active if x.problem), None)
    if p.status.served_by is not None:
        pool = naming.policy_group(p.group.spec.job_ref, p.status.served_by)
        scaled = p.group.spec.rollout.replicas
        p.condition(
            ConditionType.ROLLOUTS_READY,
            True,
            "ServedByPool",
            f"served by policy {p.status.served_by}'s rollout pool: scale PolicyGroup {pool}"
            + (f" (replicas {scaled} here start nothing)" if scaled else ""),
        )
    elif problem is not None:
        p.condition(
            ConditionType.ROLLOUTS_READY,
            False,
            problem[0],
            problem[1] or "a rollout pod cannot run",
        )
    else:
        ok = p.status.ready_replicas >= desired
        p.condition(
            ConditionType.ROLLOUTS_READY,
            ok,
            "Ready" if ok else "Waiting",
            f"{p.status.ready_replicas}/{desired} rollout pods ready",
        )
    if ok_to_reset(p):
        p.status.rollout_failures = 0
        p.status.last_failure = None


def ok_to_reset(p: GroupReconcile) -> bool:
    """Failures are forgotten once every pod has been ready for 30 s since the last one."""
    desired = _desired(p)
    trainer = find_condition(p.status.conditions, ConditionType.TRAINER_HEALTHY)
    if trainer is not None and trainer.status != ConditionStatus.TRUE:
        return False
    if not (p.status.rollout_failures or p.status.last_failure):
        return False
    if p.status.ready_replicas < desired:
        return False
    last = p.status.last_failure_time
    return last is None or seconds_since(last) > 30
