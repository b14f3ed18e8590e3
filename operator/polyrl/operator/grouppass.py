"""One reconcile pass over a PolicyGroup, and what its parts (`trainers`, `rollouts`,
`groupstatus`) share: the pass's state, rendering a launch as this group's pod, deleting
pods, a failed pod's cause, and the heartbeats of the group's pods that exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polyrl.api._version import DEFAULT_IMAGE
from polyrl.api.base import (
    ConditionType,
    now_rfc3339,
)
from polyrl.api.launch import WorkerLaunch
from polyrl.api.messages import Heartbeat, WorkerState
from polyrl.api.resources import Phase, PolicyGroup, PolicyGroupStatus, RLJob
from polyrl.operator import (
    natsusers,
    render,
    report,
)
from polyrl.operator.context import Context
from polyrl.operator.podinfo import PodInfo

FINISHED = "the trainer finished its last step"


@dataclass
class GroupReconcile(report.Recorder):
    """The state of one reconcile pass over a group."""

    ctx: Context
    body: Mapping[str, Any]
    group: PolicyGroup
    pods: list[PodInfo]
    status: PolicyGroupStatus
    job: RLJob | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    leaving: set[str] = field(default_factory=set)  # pods drained or deleted this pass
    created: int = 0
    blocked: bool = False  # this pass found the group unable to run (reason in Ready)
    idle: bool = False  # ... and runs no pods at all (`_idle`: every condition says why)
    has_service: bool = False  # the trainer's headless Service exists (from the index)

    @property
    def name(self) -> str:
        return self.group.metadata.name

    @property
    def namespace(self) -> str:
        return self.group.metadata.namespace

    @property
    def generation(self) -> int:
        return self.group.metadata.generation


def owner(p: GroupReconcile) -> dict[str, Any]:
    return render.owner_ref("PolicyGroup", p.name, p.group.metadata.uid or "")


def grace(p: GroupReconcile) -> int:
    return p.group.spec.rollout.drain_timeout_seconds + 10


def render_pod(p: GroupReconcile, launch: WorkerLaunch) -> dict[str, Any]:
    assert p.job is not None
    secret = p.job.spec.nats.credentials_secret or p.ctx.settings.nats_credentials_secret
    if p.ctx.settings.default_image and launch.image == DEFAULT_IMAGE:
        launch = launch.model_copy(update={"image": p.ctx.settings.default_image})
    return render.pod(
        launch,
        namespace=p.namespace,
        owner=owner(p),
        nats_secret=secret,
        nats_users=natsusers.secret_for(p.job, p.ctx.settings),
        grace_seconds=grace(p),
        job=p.job,
    )


async def delete_all(p: GroupReconcile, pods: Sequence[PodInfo]) -> None:
    for pod in pods:
        if not pod.deleting:
            await p.ctx.kube.delete_pod(p.namespace, pod.name, pod.uid)
            p.leaving.add(pod.name)


def spec_hash_of(body: Mapping[str, Any] | None) -> str:
    return render.spec_hash(body["spec"]) if body else ""


def record_failure(p: GroupReconcile, pod: PodInfo) -> None:
    """Keep what a failed pod said; a refusal of its input fails the whole group at once."""
    p.status.last_failure = pod.failure()
    p.status.last_failure_time = now_rfc3339()
    if pod.invalid_input:
        p.status.phase = Phase.FAILED
        p.condition(ConditionType.READY, False, "InvalidInput", p.status.last_failure)
        p.condition(ConditionType.WORKERS_HEALTHY, False, "InvalidInput", p.status.last_failure)
        p.event("Warning", "InvalidInput", f"{p.status.last_failure}; the policy failed")


def heartbeats(p: GroupReconcile) -> list[Heartbeat]:
    """The latest heartbeats of this group's pods that exist (the operator's mirror keeps
    a heartbeat after its key expires: a pod scaled away must not speak for the group)."""
    if p.job is None:
        return []
    channel = p.ctx.hub.channel(p.namespace, p.job.metadata.name)
    if channel is None:
        return []
    here = {x.name for x in p.pods if not x.deleting}
    return [
        hb
        for hb in channel.heartbeats.values()
        if hb.policy == p.group.spec.policy and hb.pod in here
    ]


def has_served(p: GroupReconcile, pod: str) -> bool:
    """The pod said it serves (or drains) in a heartbeat."""
    serving = (WorkerState.SERVING, WorkerState.DRAINING, WorkerState.DRAINED)
    return any(hb.pod == pod and hb.state in serving for hb in heartbeats(p))
