"""Reconciling one RLJob: its NATS streams, its PolicyGroups, its workflow runners, its status.

The job seeds one PolicyGroup per policy and then leaves the group's replicas alone:
scaling is the group's own business (`kubectl scale`, an HPA). Other policy settings flow
from the job to its groups. Status sums up every group that names the job, including
groups users applied for extra capacity, and the job ends (Succeeded, pods freed, status
kept) when `spec.stop` is met.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polyrl.api import naming, plan
from polyrl.api.base import (
    ConditionStatus,
    ConditionType,
    find_condition,
    now_rfc3339,
    seconds_since,
)
from polyrl.api.resources import (
    Phase,
    PolicyGroup,
    PolicySpec,
    PolicyStatus,
    RLJob,
    RLJobStatus,
    WhenDeleted,
)
from polyrl.operator import flow, metrics, natsusers, progress, render, report, scaling
from polyrl.operator.context import Context
from polyrl.operator.natshub import NatsUnavailable
from polyrl.operator.podinfo import PodInfo

log = logging.getLogger("polyrl.operator.jobs")
JOB_REPLICAS = f"{naming.LABEL_PREFIX}/job-replicas"
SHARED_NATS = (
    "the operator signs no NATS users (it runs with nats.insecure): this job's pods share "
    "NATS credentials, or none, so every pod that can reach the NATS server can read and "
    "write every job's data (docs/security.md)"
)
ISOLATED = (
    "each role of this job has a NATS user of its own, allowed only this job's subjects it needs"
)
# A group's WorkersHealthy reasons that are failures (others say the job is over or paused).
FAILURE_REASONS = ("WorkerFailed", "InvalidInput", "RestartLimitExceeded")


@dataclass
class JobReconcile(report.Recorder):
    ctx: Context
    body: Mapping[str, Any]
    job: RLJob
    status: RLJobStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def ns(self) -> str:
        return self.job.metadata.namespace

    @property
    def name(self) -> str:
        return self.job.metadata.name

    @property
    def generation(self) -> int:
        return self.job.metadata.generation


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
        await _free(p, pods)
    else:
        await _pin_nats(p)
        await _nats(p)
        await _claims(p)
        await _groups(p, groups)
        await _workflow(p, pods)
    _status(p, groups, pods)
    await _finish(p)
    metrics.RECONCILE_SECONDS.labels(kind="rljob").observe(time.monotonic() - started)
    metrics.RECONCILES.labels(kind="rljob").inc()


async def _pin_nats(p: JobReconcile) -> None:
    """A job that names no NATS keeps the operator's as it was when the job first ran: its
    streams and pods are there. A changed default is said once per job and operator."""
    meta, default = p.job.metadata, p.ctx.settings.nats_url
    pinned = meta.annotations.get(naming.A_NATS_URL)
    if p.job.spec.nats.url:
        return
    if pinned is None:
        patch = {"metadata": {"annotations": {naming.A_NATS_URL: default}}}
        await p.ctx.kube.patch_custom("rljobs", p.ns, p.name, patch)
        meta.annotations[naming.A_NATS_URL] = default
    elif pinned != default and (p.ns, p.name, pinned) not in p.ctx.noted:
        p.ctx.noted.add((p.ns, p.name, pinned))
        p.event(
            "Normal",
            "NatsKept",
            f"this job stays on the NATS it started on ({pinned}); the operator's default is "
            f"now {default}, which new jobs use (docs/operator.md, 'Moving NATS')",
        )


async def _nats(p: JobReconcile) -> None:
    if p.job.spec.suspend:
        return
    try:
        await _users(p)  # first: signing needs no NATS, and pods cannot start without them
        await p.ctx.hub.ensure_job(p.job)
    except NatsUnavailable as err:
        if _set(p, ConditionType.NATS_READY, False, "NatsUnreachable", f"{err}; retrying"):
            p.event("Warning", "NatsUnreachable", str(err))
        return
    if _set(
        p, ConditionType.NATS_READY, True, "StreamsReady", "the job's streams and buckets exist"
    ):
        p.event("Normal", "NatsReady", "created the job's NATS streams and buckets")


async def _users(p: JobReconcile) -> None:
    """Each role's own NATS user, where the operator has a signing key (natsusers), renewed
    before it expires. Without one (the operator's explicit opt-in, `nats_insecure`) the job
    says, in a condition and an event, that its data is open to every pod."""
    signer = await p.ctx.hub.signer()
    if signer is None:
        if _set(p, ConditionType.NATS_ISOLATED, False, "SharedNats", SHARED_NATS):
            p.event("Warning", "NatsNotIsolated", SHARED_NATS)
        return
    _set(p, ConditionType.NATS_ISOLATED, True, "SignedUsers", ISOLATED)
    done = await natsusers.ensure(p.ctx.kube, p.job, signer, ttl=p.ctx.settings.nats_user_ttl)
    if done is None:
        return
    if done.renewed:
        p.event("Normal", "NatsUsersRenewed", f"renewed NATS users until {done.expires}")
    else:
        p.event(
            "Normal", "NatsUsers", f"signed NATS users until {done.expires}: {', '.join(done.keys)}"
        )


def _set(p: JobReconcile, type_: ConditionType, ok: bool, reason: str, message: str) -> bool:
    """Set a condition; True when its status changed (worth an event)."""
    old = find_condition(p.status.conditions, type_)
    p.condition(type_, ok, reason, message)
    wanted = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
    return old is None or old.status != wanted


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


async def _free(p: JobReconcile, pods: Sequence[PodInfo]) -> None:
    """The job's own pods (workflow runners) go; groups free theirs when they see the job."""
    for pod in pods:
        if not pod.deleting:
            await p.ctx.kube.delete_pod(p.ns, pod.name, pod.uid)


async def _workflow(p: JobReconcile, pods: Sequence[PodInfo]) -> None:
    runners = [x for x in pods if x.role == "workflow"]
    if p.job.spec.suspend:
        await _free(p, runners)
        return
    launches = plan.plan(
        p.job,
        nats_url=p.ctx.hub.url_of(p.job),
        entrypoints=p.ctx.settings.entrypoints,
        groups=[],
    ).workflow()
    owner = render.owner_ref("RLJob", p.name, p.job.metadata.uid or "")
    by_name = {x.name: x for x in runners}
    waiting = not scaling.backoff_over(p.status.last_failure_time, p.status.workflow_failures)
    for launch in launches:
        current = by_name.get(launch.name)
        body = render.pod(
            launch,
            namespace=p.ns,
            owner=owner,
            nats_secret=p.job.spec.nats.credentials_secret,
            nats_users=natsusers.secret_for(p.job, p.ctx.settings),
        )
        if current is None:
            if not waiting:
                await p.ctx.kube.create_pod(body)
        elif not current.deleting and (
            current.terminal or current.spec_hash != render.spec_hash(body["spec"])
        ):
            await p.ctx.kube.delete_pod(p.ns, current.name, current.uid)
            if current.phase == "Failed":
                _workflow_failed(p, current)
    if not waiting and runners and all(x.ready for x in runners) and _calm(p):
        p.status.workflow_failures, p.status.last_failure = 0, None


def _workflow_failed(p: JobReconcile, pod: PodInfo) -> None:
    p.status.workflow_failures += 1
    p.status.last_failure_time = now_rfc3339()
    p.status.last_failure = pod.failure()
    delay = scaling.backoff_delay(p.status.workflow_failures)
    p.event(
        "Warning", "WorkflowRunnerFailed", f"{p.status.last_failure}; replacing it with backoff"
    )
    if pod.invalid_input:
        _end(p, Phase.FAILED, "InvalidInput", p.status.last_failure)
    log.info("%s/%s: workflow runner failed, next in %.0fs", p.ns, p.name, delay)


def _calm(p: JobReconcile) -> bool:
    """Thirty seconds without a workflow-runner failure."""
    last = p.status.last_failure_time
    return last is None or seconds_since(last) > 30


def _policy_status(
    job: RLJob, policy: PolicySpec, groups: Sequence[PolicyGroup], owned: PolicyGroup | None
) -> PolicyStatus:
    mine = [g for g in groups if g.spec.policy == policy.name]
    trainer = (
        find_condition(owned.status.conditions, ConditionType.TRAINER_HEALTHY) if owned else None
    )
    # Ready means training (its pods said so), or done; a trainer still loading, warming up
    # or evaluating is healthy but not ready.
    trainer_ready = trainer is not None and trainer.reason in ("Running", "Completed")
    # Groups without a ready rollout would drag the figure to 0; once none is ready (the job
    # ended), the job's own group says what it last served, or the trainer's final version.
    ready = [g.status.weight_version for g in mine if g.status.ready_replicas > 0]
    completed = owned is not None and owned.status.trainer_completed
    own_version = owned.status.weight_version if owned else 0
    return PolicyStatus(
        name=policy.name,
        step=owned.status.step if owned else 0,
        progress=owned.status.progress if owned else None,
        eta=owned.status.eta if owned else None,
        reward=owned.status.reward if owned else None,
        held_out=owned.status.held_out if owned else None,
        weight_version=own_version if completed or not ready else min(ready),
        ready_rollouts=sum(g.status.ready_replicas for g in mine),
        desired_rollouts=sum(g.spec.rollout.replicas for g in mine),
        trainer_ready=trainer_ready,
        completed=completed,
        output=plan.checkpoint_output(job, policy),
        **flow.policy_figures([g.status for g in mine], owned.status if owned else None),
    )


def _status(p: JobReconcile, group_bodies: Sequence[Mapping[str, Any]], pods: Sequence[PodInfo]) -> None:
    groups = [
        PolicyGroup.model_validate(
            {
                "metadata": dict(g["metadata"]),
                "spec": dict(g["spec"]),
                "status": dict(g.get("status") or {}),
            }
        )
        for g in group_bodies
    ]
    by_name = {g.metadata.name: g for g in groups}
    policies = [
        _policy_status(p.job, pol, groups, by_name.get(naming.policy_group(p.name, pol.name)))
        for pol in p.job.spec.policies
    ]
    p.status.policies = policies
    ready = [x for x in policies if x.trainer_ready and x.ready_rollouts >= x.desired_rollouts]
    p.status.policies_ready = f"{len(ready)}/{len(policies)}"
    p.status.step = min((x.step for x in policies), default=0)
    _progress(p, by_name)
    p.status.weight_version = min((x.weight_version for x in policies), default=0)
    p.status.rollouts = (
        f"{sum(x.ready_rollouts for x in policies)}/{sum(x.desired_rollouts for x in policies)}"
    )
    runners = [x for x in pods if x.role == "workflow" and not x.deleting]
    runners_ready = len([x for x in runners if x.ready]) >= p.job.spec.workflow.replicas
    _phase(p, groups, ready=len(ready) == len(policies), runners_ready=runners_ready)


def _progress(p: JobReconcile, groups: Mapping[str, PolicyGroup]) -> None:
    """The least advanced policy's progress, and the longest time left (`progress`)."""
    fractions, lefts = [], []
    for policy in p.job.spec.policies:
        owned = groups.get(naming.policy_group(p.name, policy.name))
        budget = p.job.spec.steps_of(policy)
        if owned is None or not budget:
            continue
        status = owned.status
        fractions.append((min(status.step, budget) / budget, status.step, budget))
        lefts.append(
            progress.seconds_left(
                status.step, budget, status.step_seconds, completed=status.trainer_completed
            )
        )
    if fractions:
        _, step, budget = min(fractions)
        p.status.progress = progress.progress(step, budget)
    known = [left for left in lefts if left is not None]
    if known and len(known) == len(lefts):  # one policy without a pace: no honest ETA
        p.status.eta = progress.duration(max(known))


def _phase(p: JobReconcile, groups: Sequence[PolicyGroup], *, ready: bool, runners_ready: bool) -> None:
    """Pending until every policy trains and serves and the workflow runners run episodes
    (each said so in a heartbeat: the pods' readiness); Running from then on, while pods
    are scaled or replaced (Ready then says what is degraded), until the job ends."""
    phase = Phase(p.status.phase)
    unhealthy = _workers_healthy(p, groups)
    if phase.is_terminal():
        return
    failed = [g for g in groups if g.status.phase == Phase.FAILED and g.spec.trainer is not None]
    all_ready = ready and runners_ready
    started = phase == Phase.RUNNING or (phase == Phase.PENDING and all_ready)
    if failed:
        causes = "; ".join(
            f"{g.metadata.name}: {g.status.last_failure or 'failed'}" for g in failed
        )
        p.status.last_failure = causes
        _end(p, Phase.FAILED, "PolicyFailed", f"policy group(s) failed: {causes}")
    elif _stop_reached(p):
        _end(p, Phase.SUCCEEDED, "StopReached", _stop_message(p))
    elif p.job.spec.suspend:
        p.status.phase = Phase.SUSPENDED
        p.condition(
            ConditionType.READY, False, "Suspended", "spec.suspend is true; all pods are freed"
        )
    elif unhealthy is not None:
        p.status.phase = Phase.RUNNING if phase == Phase.RUNNING else Phase.PENDING
        p.condition(ConditionType.READY, False, "WorkerFailed", unhealthy)
    else:
        p.status.phase = Phase.RUNNING if started else Phase.PENDING
        p.status.start_time = p.status.start_time or (now_rfc3339() if all_ready else None)
        p.condition(
            ConditionType.READY,
            all_ready,
            "Ready" if all_ready else ("Degraded" if started else "NotReady"),
            _readiness(p, ready=ready, runners_ready=runners_ready),
        )


def _readiness(p: JobReconcile, *, ready: bool, runners_ready: bool) -> str:
    """What Ready says: the policies ready, and what is not yet (or no longer)."""
    waiting = [w for x in p.status.policies if (w := _waiting_for(x))]
    if not runners_ready:
        waiting.append("workflow runners not running episodes yet")
    said = f"{p.status.policies_ready} policies ready"
    return f"{said} ({'; '.join(waiting)})" if waiting else said


def _waiting_for(policy: PolicyStatus) -> str | None:
    parts = [] if policy.trainer_ready else ["trainer not training yet"]
    if policy.ready_rollouts < policy.desired_rollouts:
        parts.append(f"{policy.ready_rollouts}/{policy.desired_rollouts} rollouts serving")
    return f"{policy.name}: {', '.join(parts)}" if parts else None


def _workers_healthy(p: JobReconcile, groups: Sequence[PolicyGroup]) -> str | None:
    """WorkersHealthy on the job: its workflow runners' and its groups' together. Returns
    why it is False, or None. An ended job keeps what it said when it ended."""
    if Phase(p.status.phase).is_terminal():
        return None
    causes = [p.status.last_failure] if p.status.last_failure else []
    for group in groups:
        cond = find_condition(group.status.conditions, ConditionType.WORKERS_HEALTHY)
        failing = cond is not None and cond.reason in FAILURE_REASONS
        if failing and cond is not None and cond.status == ConditionStatus.FALSE:
            causes.append(f"{group.metadata.name}: {cond.message}")
    if not causes:
        p.condition(ConditionType.WORKERS_HEALTHY, True, "Healthy", "no worker pod failed lately")
        return None
    p.condition(ConditionType.WORKERS_HEALTHY, False, "WorkerFailed", "; ".join(causes))
    return "; ".join(causes)


def _stop_reached(p: JobReconcile) -> bool:
    stop = p.job.spec.stop
    if _steps_done(p):
        return True
    if stop.duration_seconds is not None and p.status.start_time:
        return seconds_since(p.status.start_time) >= stop.duration_seconds
    return False


def _steps_done(p: JobReconcile) -> bool:
    """Every policy reached its last step (its own trainer.steps, else stop.steps)."""
    budgets = p.job.spec.all_steps()
    if not budgets:
        return False
    done = {x.name for x in p.status.policies if x.completed}
    steps = {x.name: x.step for x in p.status.policies}
    return all(
        name in done or (name in steps and steps[name] >= last) for name, last in budgets.items()
    )


def _stop_message(p: JobReconcile) -> str:
    budgets = p.job.spec.all_steps()
    if budgets and _steps_done(p):
        if len(set(budgets.values())) == 1:
            return f"every policy reached step {next(iter(budgets.values()))}"
        return (
            "every policy reached its last step ("
            + ", ".join(f"{name} {steps}" for name, steps in budgets.items())
            + ")"
        )
    return f"ran for {p.job.spec.stop.duration_seconds}s"


def _end(p: JobReconcile, phase: Phase, reason: str, message: str) -> None:
    p.status.phase = phase
    p.status.completion_time = now_rfc3339()
    p.condition(ConditionType.READY, False, reason, message)
    p.condition(ConditionType.STOPPED, True, reason, message)
    # As a batch Job says how it ended: Complete or Failed, True.
    p.condition(
        ConditionType.COMPLETE if phase == Phase.SUCCEEDED else ConditionType.FAILED,
        True,
        reason,
        message,
    )
    if phase == Phase.SUCCEEDED:  # a failure keeps its cause in WorkersHealthy
        p.condition(ConditionType.WORKERS_HEALTHY, False, reason, f"{message}; no pods run")
    p.event(
        "Normal" if phase == Phase.SUCCEEDED else "Warning",
        reason,
        f"job {phase.value}: {message}; pods are freed, status is kept",
    )


async def _finish(p: JobReconcile) -> None:
    p.status.observed_generation = p.job.metadata.generation
    await report.publish(
        p.ctx.kube,
        kind="RLJob",
        plural="rljobs",
        meta=p.job.metadata,
        before=p.job.status,
        after=p.status,
        events=p.events,
    )


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


__all__ = ["cleanup", "reconcile", "scaling"]
