"""The status halves of `RLJob` and `PolicyGroup`: what the operator reports, never what a
user sets. `resources` re-exports them beside the specs."""

from __future__ import annotations

import enum
from typing import Any

from pydantic import Field

from polyrl.api.base import ApiModel, Condition


class Phase(enum.StrEnum):
    """Lifecycle of an RLJob or PolicyGroup, shown in `kubectl get`."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    def is_terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class _Flow(ApiModel):
    """How data and weights flow for a policy, from its workers' heartbeats."""

    staleness_p50: float | None = Field(
        None, ge=0, description="Median age of the trainer's last batch, in weight versions."
    )
    staleness_p95: float | None = Field(
        None, ge=0, description="95th percentile age of the trainer's last batch."
    )
    is_deviation: float | None = Field(
        None,
        ge=0,
        description="The trainer's last step: mean |w - 1| of the importance weights w = current/behaviour (0: on-policy).",
    )
    clip_percent: float | None = Field(
        None,
        ge=0,
        le=100,
        description="The trainer's last step: share of trained tokens the objective clipped or masked, in %.",
    )
    tokens_per_second: float | None = Field(
        None, ge=0, description="Generation throughput of the running rollout pods, summed."
    )
    queue_depth: int | None = Field(
        None, ge=0, description="Generation requests waiting for a rollout pod."
    )
    sync_seconds: float | None = Field(
        None, ge=0, description="The last weight sync of a rollout pod: seconds."
    )
    sync_bytes: int | None = Field(
        None, ge=0, description="The last weight sync of a rollout pod: bytes read."
    )
    changed_percent: float | None = Field(
        None, ge=0, le=100, description="Share of the weights the last delta rewrote, in %."
    )


class PolicyStatus(_Flow):
    """Headline figures of one policy, from its PolicyGroups and worker heartbeats."""

    name: str = Field(description="Policy name.")
    step: int = Field(0, ge=0, description="Trainer step.")
    progress: str | None = Field(None, description="Steps done of the budget, e.g. 90/200 (45%).")
    eta: str | None = Field(None, description="Time left at the trainer's recent pace.")
    weight_version: int = Field(0, ge=0, description="Latest published weight version.")
    reward: float | None = Field(None, description="Recent mean reward.")
    held_out: float | None = Field(None, description="Last held-out figure of the trainer.")
    ready_rollouts: int = Field(0, ge=0, description="Ready rollout pods over all PolicyGroups.")
    desired_rollouts: int = Field(
        0, ge=0, description="Desired rollout pods over all PolicyGroups."
    )
    trainer_ready: bool = Field(
        False, description="Every trainer pod is Ready (training), or the trainer finished."
    )
    completed: bool = Field(False, description="The trainer finished its last step.")
    frozen: bool = Field(False, description="Served, never trained (frozen: true).")
    dropped_episodes: dict[str, int] | None = Field(
        None,
        description="Episodes naming this policy that the workflow runners dropped whole, by "
        "reason (turns, context, tool, environment, ...), in all.",
    )
    output: str | None = Field(
        None,
        description="Where the policy's checkpoint is, as pvc://<claim>/<path>: a Hugging Face directory (weights, config, tokenizer) that polyrl export reads.",
    )


def _conditions(which: str) -> Any:
    return Field(
        default_factory=list,
        description=which,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class _Lifecycle(ApiModel):
    """What both statuses start with: the phase, the conditions and the generation seen."""

    phase: Phase = Field(
        Phase.PENDING, description="Pending, Running, Suspended, Succeeded or Failed."
    )
    conditions: list[Condition] = _conditions("Conditions, metav1.Condition-style.")
    observed_generation: int = Field(0, ge=0, description="The generation the status reflects.")


class RLJobStatus(_Lifecycle):
    conditions: list[Condition] = _conditions("Ready, NatsReady, Stopped, ...")
    policies: list[PolicyStatus] = Field(default_factory=list, description="Per-policy progress.")
    policies_ready: str = Field(
        "0/0", description="Policies whose trainer and rollouts are ready, e.g. 2/2."
    )
    step: int = Field(0, ge=0, description="Smallest trainer step over the policies.")
    progress: str | None = Field(None, description="The least advanced policy's progress.")
    eta: str | None = Field(None, description="The longest time left over the policies.")
    weight_version: int = Field(
        0, ge=0, description="Smallest published weight version over the policies."
    )
    rollouts: str = Field("0/0", description="Ready/desired rollout pods over all policies.")
    dropped_episodes: dict[str, int] | None = Field(
        None,
        description="Episodes the workflow runners dropped whole, by reason (prompt, turns, "
        "context, tool, environment, ...), in all: no sample of them reached a trainer.",
    )
    start_time: str | None = Field(None, description="When the job first ran.")
    completion_time: str | None = Field(None, description="When the job reached a terminal phase.")
    workflow_failures: int = Field(
        0, ge=0, description="Consecutive workflow-runner pod failures (drives backoff)."
    )
    last_failure_time: str | None = Field(
        None, description="When a workflow-runner pod last failed."
    )
    last_failure: str | None = Field(
        None,
        description="What the last failed workflow-runner pod said, until runners are healthy again.",
    )
    queue_round: int = Field(
        0,
        ge=0,
        description="A queued job (Kueue): how many times its user suspended it; part of its "
        "pod group's name, so that each resume is admitted as a new Workload.",
    )


class PolicyGroupStatus(_Lifecycle, _Flow):
    conditions: list[Condition] = _conditions("Ready, TrainerHealthy, RolloutsReady, ...")
    replicas: int = Field(
        0, ge=0, description="Active rollout pods (the scale subresource's status)."
    )
    ready_replicas: int = Field(0, ge=0, description="Ready rollout pods.")
    selector: str = Field(
        "",
        description="Label selector of the active rollout pods (for the scale subresource and HPAs).",
    )
    served_by: str | None = Field(
        None,
        description="The policy whose rollout pool serves this one (rollout.servedBy): this "
        "group has no rollout pods; that policy's PolicyGroup holds and scales the pool.",
    )
    frozen: bool = Field(
        False,
        description="The policy is served, never trained (its spec says frozen: true): a "
        "publisher put its model into the Object Store once, and no trainer runs.",
    )
    trainer_pods: int = Field(0, ge=0, description="Running trainer pods.")
    trainer_ready_pods: int = Field(
        0,
        ge=0,
        description="Ready trainer pods: training (rank 0 said so in a heartbeat; the gang's other pods follow it).",
    )
    trainer_restarts: int = Field(
        0,
        ge=0,
        description="Times the trainer gang was restarted: after a failed pod, or a pod that went away (deleted, evicted); bounded by trainer.restartLimit.",
    )
    trainer_completed: bool = Field(
        False, description="The trainer finished its last step; it is not started again."
    )
    weight_version: int = Field(0, ge=0, description="Weight version the rollouts serve (lowest).")
    step: int = Field(0, ge=0, description="Trainer step (groups with a trainer).")
    progress: str | None = Field(
        None, description="Trainer steps done of the policy's budget, e.g. 90/200 (45%)."
    )
    eta: str | None = Field(
        None, description="Time left at the trainer's recent pace, e.g. 12m30s (0s once done)."
    )
    step_seconds: float | None = Field(
        None, ge=0, description="The trainer's recent seconds per step."
    )
    reward: float | None = Field(None, description="Recent mean reward reported by the trainer.")
    held_out: float | None = Field(
        None, description="The trainer's last held-out figure (its evaluation's headline)."
    )
    rollout_failures: int = Field(
        0, ge=0, description="Consecutive rollout pod failures (drives backoff)."
    )
    last_failure_time: str | None = Field(None, description="When a pod of this group last failed.")
    last_failure: str | None = Field(
        None,
        description="What the last failed pod said (its exit code and termination message), until the group is healthy again.",
    )
