"""Reconciling one RLJob: its NATS streams, its PolicyGroups, its workflow runners, its status.

The job seeds one PolicyGroup per policy and then leaves the group's replicas alone:
scaling is the group's own business (`kubectl scale`, an HPA). Other policy settings flow
from the job to its groups. Status sums up every group that names the job, including
groups users applied for extra capacity, and the job ends (Succeeded, pods freed, status
kept) when `spec.stop` is met.

This module orders a pass and does what no part of its own does (checkpoint claims, the
groups); the parts: the job's NATS (`jobnats`), its workflow runner pods (`runners`), its
status figures (`jobstatus`) and its phase and conditions (`jobphase`), all on one pass's
state (`jobpass`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from polyrl.api import naming, plan
from polyrl.api.resources import Phase, PolicyGroup, RLJob, WhenDeleted
from polyrl.operator import (
    admission,
    jobnats,
    jobstatus,
    metrics,
    render,
    report,
    runners,
    scaling,
)
from polyrl.operator.context import Context
from polyrl.operator.jobnats import SHARED_NATS
from polyrl.operator.jobpass import JobReconcile
from polyrl.operator.jobphase import FAILURE_REASONS
from polyrl.operator.natshub import NatsUnavailable
from polyrl.operator.podinfo import PodInfo

log = logging.getLogger("polyrl.operator.jobs")
JOB_REPLICAS = f"{naming.LABEL_PREFIX}/job-replicas"


def load(body: Mapping[str, Any]) -> RLJob:
    return report.load(RLJob, body)


async def reconcile(
    ctx: Context,
    body: Mapping[str, Any],
    groups: Sequence[Mapping[str, Any]],
    pods: Sequence[PodInfo],
) -> None:
    if body["metadata"].get("deletionTimestamp"):
        return  # being deleted: its finalizer removes what it has; nothing is made again
    started = time.monotonic()
    job = load(body)
    p = JobReconcile(ctx=ctx, body=body, job=job, status=job.status.model_copy(deep=True))
    if Phase(job.status.phase).is_terminal():
        await runners.free(p, pods)
    else:
        await jobnats.pin(p)
        await jobnats.ensure(p)
        await _claims(p)
        await _groups(p, groups)
        await runners.run(p, pods)
        await admission.observe(p)
    jobstatus.update(p, groups, pods)
    await jobstatus.finish(p)
    metrics.RECONCILE_SECONDS.labels(kind="rljob").observe(time.monotonic() - started)
    metrics.RECONCILES.labels(kind="rljob").inc()


async def _claims(p: JobReconcile) -> None:
    """A checkpoint claim for each policy that names none (once per job and operator)."""
    owner = render.owner_ref("RLJob", p.name, p.job.metadata.uid or "")
    for policy in p.job.spec.policies:
        spec = policy.trainer.checkpoint
        key = (p.ns, naming.checkpoint_claim(p.name, policy.name), p.job.metadata.uid or "")
        if spec.claim_name or key in p.ctx.claims:
            continue
        keep = spec.when_deleted == WhenDeleted.RETAIN
        body = render.checkpoint_claim(p.job, policy, owner=None if keep else owner)
        if await p.ctx.kube.ensure_claim(body):
            p.event(
                "Normal",
                "CheckpointClaimCreated",
                f"created PersistentVolumeClaim {key[1]} ({spec.size}) for policy "
                f"{policy.name}'s checkpoints ({'kept' if keep else 'deleted'} with the job)",
            )
        p.ctx.claims.add(key)


async def _groups(p: JobReconcile, groups: Sequence[Mapping[str, Any]]) -> None:
    existing = {g["metadata"]["name"]: g for g in groups}
    owner = render.owner_ref("RLJob", p.name, p.job.metadata.uid or "")
    for planned in plan.policy_groups(p.job):
        policy = p.job.spec.policy(planned.spec.policy)
        assert policy is not None
        current = existing.get(planned.metadata.name)
        if current is None:
            body = render.policy_group(planned, owner=owner)
            body["metadata"].setdefault("annotations", {})[JOB_REPLICAS] = str(
                policy.rollout.replicas
            )
            if await p.ctx.kube.create_custom("policygroups", body):
                p.event(
                    "Normal",
                    "PolicyGroupCreated",
                    f"created PolicyGroup {planned.metadata.name} for policy {policy.name}",
                )
            continue
        await _sync_group(p, planned, current)


async def _sync_group(p: JobReconcile, planned: PolicyGroup, current: Mapping[str, Any]) -> None:
    """Carry the job's policy settings to its group, except the group's own replicas."""
    spec = dict(current["spec"])
    rollout = {**planned.spec.rollout.to_api(), "replicas": spec["rollout"]["replicas"]}
    lo, hi = rollout["minReplicas"], rollout["maxReplicas"]
    rollout["replicas"] = min(max(rollout["replicas"], lo), hi)
    desired = {**planned.spec.to_api(), "rollout": rollout}
    patch: dict[str, Any] = {}
    if {k: spec.get(k) for k in desired} != desired:
        patch["spec"] = desired
    annotations = current["metadata"].get("annotations") or {}
    job_replicas = str(planned.spec.rollout.replicas)
    if annotations.get(JOB_REPLICAS, job_replicas) != job_replicas:
        patch["metadata"] = {"annotations": {JOB_REPLICAS: job_replicas}}
        p.event(
            "Warning",
            "RolloutReplicasIgnored",
            f"spec.policies[{planned.spec.policy}].rollout.replicas changed to "
            f"{job_replicas}; it only seeds the PolicyGroup. Scale the group instead: "
            f"kubectl scale pg {planned.metadata.name} --replicas={job_replicas}",
        )
    if patch:
        await p.ctx.kube.patch_custom("policygroups", p.ns, planned.metadata.name, patch)


async def cleanup(ctx: Context, body: Mapping[str, Any]) -> None:
    """Finalizer: remove the job's NATS streams and buckets, bounded in time.

    When NATS cannot be reached in `cleanup_timeout` the finalizer gives up with a Warning
    event instead of blocking the delete forever; the streams then need removing by hand.
    """
    job = load(body)
    obj = {
        "apiVersion": "polyrl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {
            "name": job.metadata.name,
            "namespace": job.metadata.namespace,
            "uid": job.metadata.uid,
        },
    }
    try:
        removed = await asyncio.wait_for(
            ctx.hub.remove_job(job), timeout=ctx.settings.cleanup_timeout
        )
    except (TimeoutError, NatsUnavailable, OSError) as err:
        await ctx.kube.event(
            obj,
            type="Warning",
            reason="NatsCleanupFailed",
            message=f"could not remove the job's NATS streams within "
            f"{ctx.settings.cleanup_timeout:.0f}s ({type(err).__name__}); "
            "deleting the job anyway",
        )
        return
    log.info(
        "removed NATS streams and buckets of %s/%s: %s",
        job.metadata.namespace,
        job.metadata.name,
        ", ".join(removed) or "none",
    )


__all__ = [
    "FAILURE_REASONS",
    "SHARED_NATS",
    "JobReconcile",
    "cleanup",
    "load",
    "reconcile",
    "scaling",
]
