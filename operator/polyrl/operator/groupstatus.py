"""A PolicyGroup's status from its pods and their heartbeats: figures only from pods that
exist, progress and ETA, Ready and the phase (Running once it first serves, kept while it
scales or replaces pods), WorkersHealthy; then the patch and the pass's events (`report`).
"""

from __future__ import annotations

from polyrl.api.base import (
    ConditionStatus,
    ConditionType,
    find_condition,
)
from polyrl.api.launch import Role
from polyrl.api.messages import WorkerState
from polyrl.api.resources import Phase
from polyrl.operator import (
    flow,
    grouppass,
    progress,
    report,
)
from polyrl.operator.grouppass import GroupReconcile


def _heartbeat_figures(p: GroupReconcile) -> None:
    mine = grouppass.heartbeats(p)
    running = {x.name for x in p.pods if x.role == Role.ROLLOUT.value and x.active}
    running -= p.leaving
    serving = [hb for hb in mine if hb.role == Role.ROLLOUT.value and hb.pod in running]
    if versions := [hb.weight_version for hb in serving if WorkerState(hb.state).is_ready()]:
        p.status.weight_version = min(versions)
    if versions := _served_versions(p):
        p.status.weight_version = min(versions)
    trainers = [hb for hb in mine if hb.role == Role.TRAINER.value]
    done = [hb.weight_version for hb in trainers if hb.state == WorkerState.DONE]
    if done:  # the final version, whether or not the rollouts got to it before they stopped
        p.status.weight_version = max(done)
    if trainers:
        p.status.step = max(hb.step for hb in trainers)
        rewards = [hb.reward for hb in trainers if hb.reward is not None]
        p.status.reward = round(rewards[0], 4) if rewards else p.status.reward
        held = [hb.held_out for hb in trainers if hb.held_out is not None]
        p.status.held_out = round(held[0], 4) if held else p.status.held_out
        paces = [hb.step_seconds for hb in trainers if hb.step_seconds]
        p.status.step_seconds = round(paces[0], 3) if paces else p.status.step_seconds
    for key, value in flow.group_figures(mine, running).items():
        setattr(p.status, key, value)
    _progress(p)


def _served_versions(p: GroupReconcile) -> list[int]:
    """The versions the serving pool's ready replicas serve this group's policy at, from
    their heartbeats' per-policy figures (`Heartbeat.pool`), for a group served by another
    policy's pool."""
    if p.status.served_by is None or p.job is None:
        return []
    channel = p.ctx.hub.channel(p.namespace, p.job.metadata.name)
    beats = channel.heartbeats.values() if channel is not None else []
    policy = p.group.spec.policy
    return [
        hb.pool[policy].weight_version
        for hb in beats
        if hb.policy == p.status.served_by
        and hb.pool is not None
        and policy in hb.pool
        and WorkerState(hb.state).is_ready()
    ]


def _progress(p: GroupReconcile) -> None:
    """Progress and ETA of a group with the trainer (`progress`)."""
    policy = p.job.spec.policy(p.group.spec.policy) if p.job else None
    if p.group.spec.frozen:
        p.status.progress = "frozen"  # what the printer column shows for a served-only policy
        return
    if p.job is None or policy is None or not p.group.spec.trainer:
        return
    budget = p.job.spec.steps_of(policy)
    p.status.progress = progress.progress(p.status.step, budget)
    p.status.eta = progress.eta(
        p.status.step, budget, p.status.step_seconds, completed=p.status.trainer_completed
    )


def _phase_and_ready(p: GroupReconcile) -> None:
    """Ready: the trainer trains and the rollouts serve. The phase turns Running once the
    group first serves and stays Running while it scales or replaces a pod; Ready says what
    is degraded meanwhile."""
    if p.idle:
        return  # `_idle` said why, in every condition
    _workers_healthy(p)
    if p.blocked or p.status.phase == Phase.FAILED:
        return
    trainer = find_condition(p.status.conditions, ConditionType.TRAINER_HEALTHY)
    rollouts = find_condition(p.status.conditions, ConditionType.ROLLOUTS_READY)
    rollouts_ok = rollouts is not None and rollouts.status == ConditionStatus.TRUE
    needs_trainer = p.group.spec.trainer is not None or p.group.spec.frozen
    trainer_ok = not needs_trainer or (
        trainer is not None and trainer.reason in ("Running", "Completed", "Published")
    )
    serving = (
        p.status.ready_replicas > 0
        or p.group.spec.rollout.replicas == 0
        or p.status.served_by is not None  # its pool is another group's
    )
    started = p.group.status.phase == Phase.RUNNING
    p.status.phase = Phase.RUNNING if started or (trainer_ok and serving) else Phase.PENDING
    ok = trainer_ok and rollouts_ok
    if p.status.last_failure and not ok:
        p.condition(ConditionType.READY, False, "WorkerFailed", p.status.last_failure)
        return
    degraded = [
        c.message for c in (trainer, rollouts) if c is not None and c.status != ConditionStatus.TRUE
    ]
    if not trainer_ok and trainer is not None and trainer.status == ConditionStatus.TRUE:
        degraded.insert(0, trainer.message)
    p.condition(
        ConditionType.READY,
        ok,
        "Ready" if ok else ("Degraded" if started else "NotReady"),
        (_READY_FROZEN if p.group.spec.frozen else _READY) if ok else "; ".join(degraded),
    )


_READY = "the trainer trains and the rollouts serve"
_READY_FROZEN = "the model is published (frozen: never trained) and the rollouts serve"


def _workers_healthy(p: GroupReconcile) -> None:
    """WorkersHealthy: False, quoting the last failed pod, until the group recovers."""
    if p.status.phase == Phase.FAILED:
        return  # set, with its reason, where the group failed
    if p.status.last_failure is None:
        p.condition(
            ConditionType.WORKERS_HEALTHY, True, "Healthy", "no pod of this group failed lately"
        )
    else:
        p.condition(ConditionType.WORKERS_HEALTHY, False, "WorkerFailed", p.status.last_failure)


async def finish(p: GroupReconcile) -> None:
    _heartbeat_figures(p)
    _phase_and_ready(p)
    p.status.observed_generation = p.group.metadata.generation
    await report.publish(
        p.ctx.kube,
        kind="PolicyGroup",
        plural="policygroups",
        meta=p.group.metadata,
        before=p.group.status,
        after=p.status,
        events=p.events,
    )
