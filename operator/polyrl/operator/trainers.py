"""A PolicyGroup's trainer: its gang of pods, created, replaced and restarted as a whole.

Only the group its job owns trains (a second one is refused). A failed pod, or one that went
away without the operator deleting it, restarts the gang from its checkpoint, up to
`trainer.restartLimit`; a spec change restarts it; a trainer past its last step is never
started again. `TrainerHealthy` says which: Starting, Preparing (running, not yet training),
Running (training), Restarting, Updating, Completed, RestartLimitExceeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyrl.api import naming
from polyrl.api.base import (
    ConditionType,
)
from polyrl.api.launch import Role, WorkerLaunch
from polyrl.api.messages import WorkerState
from polyrl.api.resources import Phase, PolicySpec
from polyrl.operator import (
    grouppass,
    render,
    scaling,
)
from polyrl.operator.grouppass import FINISHED, GroupReconcile
from polyrl.operator.podinfo import PodInfo


def _trainer_allowed(p: GroupReconcile) -> bool:
    """Only the group the job owns trains; a trainer declared elsewhere is refused."""
    assert p.job is not None
    owned = any(
        ref.get("uid") == p.job.metadata.uid
        for ref in p.body["metadata"].get("ownerReferences") or []
    )
    if p.group.spec.trainer is not None and not owned:
        p.blocked = True
        p.condition(
            ConditionType.READY,
            False,
            "DuplicateTrainer",
            f"policy {p.group.spec.policy!r} already has its trainer in "
            f"{naming.policy_group(p.job.metadata.name, p.group.spec.policy)}; this "
            "group runs rollouts only (remove spec.trainer)",
        )
        return False
    return p.group.spec.trainer is not None


async def run(p: GroupReconcile, policy: PolicySpec, launches: list[WorkerLaunch]) -> None:
    pods = [x for x in p.pods if x.role == Role.TRAINER.value]
    if not _trainer_allowed(p):
        await grouppass.delete_all(p, pods)
        p.status.trainer_pods = 0
        return
    trainer = p.group.spec.trainer
    assert trainer is not None
    if not p.has_service:
        await p.ctx.kube.ensure_service(render.trainer_service(p.group, owner=grouppass.owner(p)))
    rendered = {x.name: grouppass.render_pod(p, x) for x in launches}
    failed = [x for x in pods if x.phase == "Failed" and not x.deleting]
    if (pods and all(x.phase == "Succeeded" for x in pods)) or _trainer_done(p):
        p.status.trainer_completed = True
    if p.status.trainer_completed:
        pass  # finished: never started again, its pods left as they are until the job ends
    elif failed:
        await _restart_trainer(p, pods, failed, trainer.restart_limit)
    elif lost := _lost_trainer_pods(p, pods, len(launches)):
        await _replace_lost_trainer(p, pods, lost, trainer.restart_limit)
    elif any(x.deleting for x in pods):
        pass  # a gang restart or update is under way: wait until the old pods are gone
    elif any(x.spec_hash != grouppass.spec_hash_of(rendered.get(x.name)) for x in pods):
        await grouppass.delete_all(p, pods)
        why = "trainer spec changed; restarting the trainer pods"
        p.condition(ConditionType.TRAINER_HEALTHY, False, "Updating", why)
        p.event("Normal", "TrainerUpdated", why)
    elif scaling.backoff_over(p.status.last_failure_time, p.status.trainer_restarts):
        await _create_missing(p, rendered, {x.name for x in pods})
    _trainer_status(p, pods, len(launches), failed=bool(failed))


def _lost_trainer_pods(p: GroupReconcile, pods: list[PodInfo], wanted: int) -> list[str]:
    """Trainer pods that were running at the last pass and are now gone or going, though
    the operator did not delete them (a `kubectl delete pod`, an eviction, a lost node).
    Pods Kueue stopped (a preemption) are not lost: the gang waits to be admitted again,
    and that costs no restart of the trainer's restartLimit."""
    if not p.group.status.trainer_pods:
        return []  # nothing was running (or the operator itself took it down last pass)
    going = [x.name for x in pods if x.deleting and not x.stopped_by_queue]
    if not going and any(x.stopped_by_queue for x in pods):
        return []
    missing = wanted - len(pods)
    return going + (["(gone)"] * missing if missing > 0 else [])


async def _replace_lost_trainer(
    p: GroupReconcile, pods: list[PodInfo], lost: list[str], limit: int
) -> None:
    """A lost trainer pod restarts the gang from its checkpoint, counted like a failure."""
    names = ", ".join(x for x in lost if x != "(gone)") or "a trainer pod"
    await grouppass.delete_all(p, pods)
    if p.status.trainer_restarts >= limit:
        p.status.phase = Phase.FAILED
        message = f"trainer pod {names} was lost after {limit} restarts"
        p.condition(ConditionType.TRAINER_HEALTHY, False, "RestartLimitExceeded", message)
        p.condition(ConditionType.WORKERS_HEALTHY, False, "RestartLimitExceeded", message)
        p.event("Warning", "TrainerFailed", message)
        return
    p.status.trainer_restarts += 1
    message = (
        f"trainer pod {names} went away (deleted or evicted); restarting the trainer from its "
        f"checkpoint (restart {p.status.trainer_restarts}/{limit})"
    )
    p.condition(ConditionType.TRAINER_HEALTHY, False, "Restarting", message)
    p.event("Warning", "TrainerRestarted", message)


def _trainer_status(p: GroupReconcile, pods: list[PodInfo], wanted: int, *, failed: bool) -> None:
    """TrainerHealthy and the trainer's pod counts. Running pods are healthy; Ready ones
    train (rank 0 said so in a heartbeat; the others follow it)."""
    running = [
        x for x in pods if x.phase == "Running" and not x.deleting and x.name not in p.leaving
    ]
    ready = [x for x in running if x.ready]
    p.status.trainer_pods, p.status.trainer_ready_pods = len(running), len(ready)
    if p.status.trainer_completed:
        p.condition(ConditionType.TRAINER_HEALTHY, True, "Completed", FINISHED)
    elif p.status.phase == Phase.FAILED or failed or p.leaving & {x.name for x in pods}:
        return  # said where it failed, or is restarting
    elif len(running) < wanted:
        # A pod that cannot start says why (unschedulable, its image, Kueue's gate).
        stuck = next((x for x in pods if x.problem and not x.deleting), None)
        reason, why = stuck.problem if stuck and stuck.problem else ("Starting", "")
        message = f"{len(running)}/{wanted} trainer pods running"
        if stuck is not None:
            message += f"; {stuck.name}: {why or reason}"
        p.condition(ConditionType.TRAINER_HEALTHY, False, reason, message)
    elif len(ready) < wanted:
        p.condition(
            ConditionType.TRAINER_HEALTHY,
            True,
            "Preparing",
            f"{wanted}/{wanted} trainer pods running, {len(ready)} ready: loading the model, "
            "warming up or evaluating before its first RL step",
        )
    else:
        p.condition(
            ConditionType.TRAINER_HEALTHY,
            True,
            "Running",
            f"{wanted}/{wanted} trainer pods running and training",
        )


def _trainer_done(p: GroupReconcile) -> bool:
    """The trainer said, in its last heartbeat, that it is past its last step."""
    return any(
        hb.state == WorkerState.DONE
        for hb in grouppass.heartbeats(p)
        if hb.role == Role.TRAINER.value
    )


async def _restart_trainer(
    p: GroupReconcile, pods: list[PodInfo], failed: list[PodInfo], limit: int
) -> None:
    names = ", ".join(x.name for x in failed)
    await grouppass.delete_all(p, pods)
    grouppass.record_failure(p, failed[0])
    if any(x.invalid_input for x in failed):
        return  # _record_failure failed the group: restarting cannot help
    if p.status.trainer_restarts >= limit:
        p.status.phase = Phase.FAILED
        message = f"trainer pod(s) {names} failed after {limit} restarts; {p.status.last_failure}"
        p.condition(ConditionType.TRAINER_HEALTHY, False, "RestartLimitExceeded", message)
        p.condition(ConditionType.WORKERS_HEALTHY, False, "RestartLimitExceeded", message)
        p.event(
            "Warning", "TrainerFailed", f"restart limit {limit} reached: {p.status.last_failure}"
        )
        return
    p.status.trainer_restarts += 1
    p.condition(
        ConditionType.TRAINER_HEALTHY,
        False,
        "Restarting",
        f"restart {p.status.trainer_restarts}/{limit}: {p.status.last_failure}",
    )
    p.event("Warning", "TrainerRestarted", f"trainer failed, restarting: {p.status.last_failure}")


async def _create_missing(
    p: GroupReconcile, rendered: Mapping[str, dict[str, Any]], existing: set[str]
) -> int:
    made = 0
    for name, body in rendered.items():
        if name not in existing and await p.ctx.kube.create_pod(body):
            made += 1
    return made
