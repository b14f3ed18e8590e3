"""An RLJob's status figures, summed up from every group that names the job.

Each policy's line comes from the group the job owns (its trainer's step, progress, reward,
checkpoint) and from all of the policy's groups together, including groups users applied for
extra capacity (rollouts ready and desired, the oldest weights served). The job's own figures
are the least advanced policy's. The phase and the conditions are decided from these
(`jobphase`), and the status is patched only where it changed (`finish`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polyrl.api import naming, plan
from polyrl.api.base import ConditionType, find_condition
from polyrl.api.resources import PolicyGroup, PolicySpec, PolicyStatus, RLJob
from polyrl.operator import flow, jobphase, progress, report
from polyrl.operator.jobpass import JobReconcile
from polyrl.operator.podinfo import PodInfo


def update(
    p: JobReconcile, group_bodies: Sequence[Mapping[str, Any]], pods: Sequence[PodInfo]
) -> None:
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
    trained = [x for x in policies if not x.frozen]  # a frozen policy stays at step 0
    p.status.step = min((x.step for x in trained), default=0)
    _progress(p, by_name)
    p.status.weight_version = min((x.weight_version for x in trained), default=0)
    p.status.rollouts = (
        f"{sum(x.ready_rollouts for x in policies)}/{sum(x.desired_rollouts for x in policies)}"
    )
    _dropped(p, policies)
    runners = [x for x in pods if x.role == "workflow" and not x.deleting]
    runners_ready = len([x for x in runners if x.ready]) >= p.job.spec.workflow.replicas
    jobphase.update(p, groups, ready=len(ready) == len(policies), runners_ready=runners_ready)


def _dropped(p: JobReconcile, policies: Sequence[PolicyStatus]) -> None:
    """Episodes the runners dropped whole, from their heartbeats (`flow.dropped_episodes`)."""
    channel = p.ctx.hub.channel(p.ns, p.name)
    by_policy = flow.dropped_episodes(channel.heartbeats.values() if channel else [])
    for policy in policies:
        policy.dropped_episodes = flow.totals({policy.name: by_policy.get(policy.name, {})})
    p.status.dropped_episodes = flow.totals(by_policy)


def _policy_status(
    job: RLJob, policy: PolicySpec, groups: Sequence[PolicyGroup], owned: PolicyGroup | None
) -> PolicyStatus:
    mine = [g for g in groups if g.spec.policy == policy.name]
    trainer = (
        find_condition(owned.status.conditions, ConditionType.TRAINER_HEALTHY) if owned else None
    )
    # Ready means training (its pods said so), or done, or (frozen) published; a trainer
    # still loading, warming up or evaluating is healthy but not ready.
    trainer_ready = trainer is not None and trainer.reason in ("Running", "Completed", "Published")
    # Groups without a ready rollout would drag the figure to 0; once none is ready (the job
    # ended), the job's own group says what it last served, or the trainer's final version.
    ready = [
        g.status.weight_version for g in mine if g.status.ready_replicas > 0 or g.status.served_by
    ]
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
        # A policy another's pool serves (`rollout.servedBy`) wants no pods of its own.
        desired_rollouts=sum(g.spec.rollout.replicas for g in mine if not g.status.served_by),
        trainer_ready=trainer_ready,
        completed=completed,
        frozen=policy.frozen,
        output=plan.checkpoint_output(job, policy),
        **flow.policy_figures([g.status for g in mine], owned.status if owned else None),
    )


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


async def finish(p: JobReconcile) -> None:
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
