"""Reconciling one PolicyGroup: its trainer (if any), its rollout pool, its status.

One pass compares what should run (from `plan.group_launches`) with the pods in the index
and acts: creates missing pods, replaces failed ones with backoff, restarts a failed
trainer as a gang up to `restartLimit`, rolls out spec changes, and scales the rollout pool
down drain-first (see `scaling.victims`). Problems the schema cannot catch (no such job or
policy, a job the models refuse, a second trainer) become `Ready=False` conditions with a
reason, and no pods.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from polyrl.api import naming, plan, queueing
from polyrl.api.base import (
    ConditionType,
    find_condition,
)
from polyrl.api.launch import Role
from polyrl.api.resources import Phase, PolicyGroup, RLJob
from polyrl.operator import (
    admission,
    grouppass,
    groupstatus,
    metrics,
    publishers,
    refused,
    report,
    rollouts,
    trainers,
)
from polyrl.operator.context import Context
from polyrl.operator.grouppass import FINISHED, GroupReconcile
from polyrl.operator.podinfo import PodInfo


def load(body: Mapping[str, Any]) -> PolicyGroup:
    return report.load(PolicyGroup, body)


async def reconcile(
    ctx: Context,
    body: Mapping[str, Any],
    pods: Sequence[PodInfo],
    job_body: Mapping[str, Any] | None,
    *,
    has_service: bool = False,
) -> None:
    started = time.monotonic()
    group = load(body)
    p = GroupReconcile(
        ctx=ctx,
        body=body,
        group=group,
        pods=list(pods),
        status=group.status.model_copy(deep=True),
        has_service=has_service,
    )
    await _run(p, job_body)
    await groupstatus.finish(p)
    metrics.RECONCILE_SECONDS.labels(kind="policygroup").observe(time.monotonic() - started)
    metrics.RECONCILES.labels(kind="policygroup").inc()


async def _run(p: GroupReconcile, job_body: Mapping[str, Any] | None) -> None:
    try:
        p.job = RLJob.model_validate(_job_doc(job_body)) if job_body else None
    except ValidationError as err:  # the job says so too, Failed (refused.py)
        why = f"RLJob {p.group.spec.job_ref!r} cannot run: {refused.explain(err)}"
        await _idle(p, Phase.FAILED, "JobInvalid", f"{why}; no pods are started")
        return
    policy = p.job.spec.policy(p.group.spec.policy) if p.job else None
    if p.job is None or policy is None:
        reason = "JobNotFound" if p.job is None else "PolicyNotFound"
        what = (
            f"RLJob {p.group.spec.job_ref!r}"
            if p.job is None
            else f"policy {p.group.spec.policy!r} in RLJob {p.group.spec.job_ref!r}"
        )
        await _idle(p, Phase.PENDING, reason, f"{what} does not exist; no pods are started")
        return
    job_phase = Phase(p.job.status.phase)
    if p.job.spec.suspend or job_phase.is_terminal():
        reason = "Suspended" if p.job.spec.suspend else job_phase.value
        why = "the job is suspended" if p.job.spec.suspend else _ended(p.job)
        await _idle(p, Phase.SUSPENDED if p.job.spec.suspend else job_phase, reason, why)
        return
    await admission.let_go(p.ctx.kube, p.job, p.pods)
    if (too_many := queueing.refusal(p.job)) is not None:
        await _idle(p, Phase.PENDING, "TooManyPodSets", too_many)
        return
    launches = plan.group_launches(
        p.job,
        p.group,
        policy,
        nats_url=p.ctx.hub.url_of(p.job),
        entrypoints=p.ctx.settings.entrypoints,
    )
    await trainers.run(p, policy, [x for x in launches if x.role == Role.TRAINER])
    await publishers.run(p, policy, [x for x in launches if x.role == Role.PUBLISHER])
    await rollouts.run(p, [x for x in launches if x.role == Role.ROLLOUT])


def _ended(job: RLJob) -> str:
    """Why the job ended, as its own conditions say (a failure's cause, quoted)."""
    said = find_condition(job.status.conditions, ConditionType.STOPPED)
    return f"the job has ended: {said.message}" if said and said.message else "the job has ended"


async def _idle(p: GroupReconcile, phase: Phase, reason: str, message: str) -> None:
    """The group runs no pods (it cannot, or its job is suspended or over): Ready False
    saying why, and its health conditions say that its pods are gone; a failure the group
    recorded itself stays in WorkersHealthy, and in TrainerHealthy when the trainer (or
    publisher) was what failed (its restart limit), so the cause outlives the job's end."""
    failed_itself = p.group.status.phase == Phase.FAILED
    p.condition(ConditionType.READY, False, reason, message)
    gone = f"{message}; no pods run"
    trainer_said = find_condition(p.group.status.conditions, ConditionType.TRAINER_HEALTHY)
    if p.status.trainer_completed:  # it did all it had to: healthy, and gone
        p.condition(ConditionType.TRAINER_HEALTHY, True, "Completed", f"{FINISHED}; no pods run")
    elif failed_itself and trainer_said and trainer_said.reason == "RestartLimitExceeded":
        pass  # the cause of the failure, kept
    elif p.group.spec.trainer is not None:
        p.condition(ConditionType.TRAINER_HEALTHY, False, reason, gone)
    p.condition(ConditionType.ROLLOUTS_READY, False, reason, gone)
    if not failed_itself:
        p.condition(ConditionType.WORKERS_HEALTHY, False, reason, gone)
    p.status.phase, p.blocked, p.idle = phase, True, True
    p.status.replicas = p.status.ready_replicas = 0
    p.status.trainer_pods = p.status.trainer_ready_pods = 0
    p.status.selector = naming.active_rollout_selector(p.name)
    await admission.release(p.ctx.kube, p.job, p.pods)
    await grouppass.delete_all(p, p.pods)


def _job_doc(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "metadata": dict(body["metadata"]),
        "spec": dict(body["spec"]),
        "status": dict(body.get("status") or {}),
    }
