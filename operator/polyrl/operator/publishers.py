"""A frozen policy's publisher: one pod that puts the model into the Object Store, then ends.

In the group the job owns for a frozen policy (`frozen: true`) it takes the trainer's place:
the pod publishes the model bundle and version 0 (keyframe) once and exits 0, and the
group's rollout replicas, near or remote, load from the bucket as they would from a
trainer's. A failed publisher pod is replaced, up to `trainer.restartLimit` (its refused
input fails the group at once); a restarted one finds version 0 published and ends at once.
`TrainerHealthy` says Publishing, Published or RestartLimitExceeded.
"""

from __future__ import annotations

from polyrl.api.base import ConditionType
from polyrl.api.launch import Role, WorkerLaunch
from polyrl.api.resources import Phase, PolicySpec
from polyrl.operator import grouppass, scaling
from polyrl.operator.grouppass import GroupReconcile
from polyrl.operator.podinfo import PodInfo

PUBLISHED = (
    "the model bundle and weights are in the Object Store; the policy is served, never trained"
)


async def run(p: GroupReconcile, policy: PolicySpec, launches: list[WorkerLaunch]) -> None:
    pods = [x for x in p.pods if x.role == Role.PUBLISHER.value]
    p.status.frozen = p.group.spec.frozen
    if not p.group.spec.frozen:
        await grouppass.delete_all(p, pods)
        return
    failed = [x for x in pods if x.phase == "Failed" and not x.deleting]
    if failed:
        await _replace(p, pods, failed[0], policy.trainer.restart_limit)
    elif any(x.phase == "Succeeded" for x in pods):
        p.condition(ConditionType.TRAINER_HEALTHY, True, "Published", PUBLISHED)
    elif not pods and scaling.backoff_over(p.status.last_failure_time, p.status.trainer_restarts):
        for launch in launches:
            await p.ctx.kube.create_pod(grouppass.render_pod(p, launch))
        _publishing(p)
    elif pods:
        _publishing(p)


def _publishing(p: GroupReconcile) -> None:
    p.condition(
        ConditionType.TRAINER_HEALTHY,
        True,
        "Publishing",
        "frozen policy: the publisher loads the model and puts it into the Object Store",
    )


async def _replace(p: GroupReconcile, pods: list[PodInfo], failed: PodInfo, limit: int) -> None:
    """A failed publisher is deleted, to be created again after the backoff, up to `limit`."""
    await grouppass.delete_all(p, pods)
    grouppass.record_failure(p, failed)
    if failed.invalid_input:
        return  # record_failure failed the group: publishing again cannot help
    if p.status.trainer_restarts >= limit:
        p.status.phase = Phase.FAILED
        message = (
            f"publisher pod {failed.name} failed after {limit} restarts; {p.status.last_failure}"
        )
        p.condition(ConditionType.TRAINER_HEALTHY, False, "RestartLimitExceeded", message)
        p.condition(ConditionType.WORKERS_HEALTHY, False, "RestartLimitExceeded", message)
        p.event("Warning", "PublisherFailed", message)
        return
    p.status.trainer_restarts += 1
    message = f"restart {p.status.trainer_restarts}/{limit}: {p.status.last_failure}"
    p.condition(ConditionType.TRAINER_HEALTHY, False, "Restarting", message)
    p.event("Warning", "PublisherRestarted", f"publisher failed, restarting: {message}")
