"""Control messages between the operator and the workers (heartbeats, drain), versioned.

Every wire message carries `v`; a receiver refuses a version it does not know instead of
guessing. Heartbeats live in the job's KV bucket (one key per worker, a TTL so dead workers
vanish); drain is a request on the pod's drain subject, answered at once with an ack, and
followed by a `Drained` message once the pod's in-flight requests are done.
"""

from __future__ import annotations

import enum
from typing import Final, Literal

from pydantic import Field

from polyrl.api.base import ApiModel

WIRE_VERSION: Final = 1


class WorkerState(enum.StrEnum):
    STARTING = "starting"
    SERVING = "serving"
    TRAINING = "training"
    DRAINING = "draining"
    DRAINED = "drained"
    DONE = "done"  # a trainer past its last step, its last version published and saved

    def is_ready(self) -> bool:
        """The worker does its job (serves, trains, runs episodes, or finished): said in a
        heartbeat, its pod is Ready (the readiness probe, `polyrl.workers.runtime.prometheus`)."""
        return self in (WorkerState.SERVING, WorkerState.TRAINING, WorkerState.DONE)


class PoolShare(ApiModel):
    """A shared rollout pool's figures for one of the policies it serves."""

    requests_served: int = Field(0, ge=0, description="This policy's requests answered.")
    weight_version: int = Field(0, ge=0, description="This policy's weight version served.")
    queue_depth: int | None = Field(
        None, ge=0, description="This policy's requests waiting in its queue, not yet taken."
    )
    queue_seconds_p50: float | None = Field(
        None,
        ge=0,
        description="Median time this policy's last requests (up to 256) waited in their "
        "queue before this replica took them (by the NATS server's clock).",
    )
    queue_seconds_p95: float | None = Field(
        None, ge=0, description="95th percentile of the same waits."
    )


class Heartbeat(ApiModel):
    """What a worker reports every few seconds (the operator derives status from it)."""

    v: Literal[1] = WIRE_VERSION
    pod: str = Field(description="Pod (or local process) name.")
    role: str = Field(description="trainer, rollout, workflow or publisher.")
    policy: str | None = Field(None, description="Policy served or trained.")
    state: WorkerState = Field(WorkerState.STARTING, description="Lifecycle state.")
    weight_version: int = Field(
        0,
        ge=0,
        description="Weight version loaded (rollout), or the one a trainer trains from: put at "
        "once when it starts publishing it (the workflow runner's staleness bound reads it).",
    )
    step: int = Field(0, ge=0, description="Trainer step.")
    step_seconds: float | None = Field(
        None, ge=0, description="Trainer: recent seconds per step (smoothed); ETAs come from it."
    )
    requests_served: int = Field(0, ge=0, description="Generation requests answered so far.")
    in_flight: int = Field(0, ge=0, description="Requests being generated now.")
    dropped_prompts: int = Field(
        0,
        ge=0,
        description="Workflow runner: episodes dropped because a policy could not take their "
        "prompt (longer than its limit, or refused by its rollout worker).",
    )
    dropped_samples: int = Field(
        0, ge=0, description="Workflow runner: samples dropped because their reward failed."
    )
    dropped_episodes: dict[str, dict[str, int]] | None = Field(
        None,
        description="Workflow runner: episodes dropped whole, by policy (`-` where the cause "
        "names none) and reason: `prompt` (a prompt a policy cannot take), `turns` and "
        "`context` (a conversation past workflow.maxTurns or maxContextTokens), `tool`, "
        "`environment`, `generation` (no rollout answered), `judge` (a verdict failed), or "
        "a workflow's own.",
    )
    judge_fallbacks: dict[str, int] | None = Field(
        None,
        description="Workflow runner: verdicts of each judging policy that failed and were "
        "replaced by workflow.judge.fallbackScore (the episodes went on).",
    )
    failed_episodes: int = Field(
        0,
        ge=0,
        description="Workflow runner: episodes that failed (a generation that timed out, a "
        "workflow error); each is logged with its cause.",
    )
    dead_letters: int = Field(
        0,
        ge=0,
        description="Messages this worker could not parse (kept on the dead-letter stream).",
    )
    tokens_per_second: float = Field(0.0, ge=0, description="Recent generation throughput.")
    reward: float | None = Field(None, description="Recent mean reward (trainer).")
    held_out: float | None = Field(
        None,
        description="The trainer's last held-out figure: its evaluation's headline (greedy accuracy for an answering policy, a verifier's balanced accuracy on its exam).",
    )
    idle_fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Share of the time since start with nothing to do (rollout: no request; "
        "trainer: waiting for samples; workflow: waiting for weights in sync mode).",
    )
    staleness_p50: float | None = Field(
        None, ge=0, description="Trainer: median age, in weight versions, of its last batch."
    )
    staleness_p95: float | None = Field(
        None, ge=0, description="Trainer: 95th percentile of its last batch's sample ages."
    )
    stale_dropped: int = Field(
        0, ge=0, description="Trainer: samples dropped as older than maxStaleness, in all."
    )
    is_deviation: float | None = Field(
        None,
        ge=0,
        description="Trainer: mean |w - 1| over its last step's trained tokens, w the "
        "importance weight current/behaviour (how off-policy its samples were).",
    )
    clip_fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Trainer: share of its last step's trained tokens whose ratio the "
        "objective clipped or masked.",
    )
    is_m2: float | None = Field(
        None, ge=0, description="Trainer: mean (log w)^2 of its last step (M2PO's second moment)."
    )
    sync_seconds: float | None = Field(
        None, ge=0, description="Rollout: seconds its last weight sync took (fetch and apply)."
    )
    sync_bytes: int | None = Field(
        None, ge=0, description="Rollout: bytes its last weight sync read from the bucket."
    )
    changed_fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Rollout: share of the weights' elements its last delta rewrote.",
    )
    weights_refused: int = Field(
        0,
        ge=0,
        description="Rollout: weight objects it refused (corrupt, wrong base, missing) and "
        "resynced around, in all.",
    )
    sync_failures: int = Field(
        0,
        ge=0,
        description="Rollout: syncs that found no path to the announced version (it kept "
        "serving the version it had), in all.",
    )
    queue_depth: int | None = Field(
        None,
        ge=0,
        description="Rollout: requests of its policy waiting in the queue, not yet taken.",
    )
    pool: dict[str, PoolShare] | None = Field(
        None,
        description="Rollout in a shared pool (`rollout.servedBy`): the figures of each "
        "policy it serves, its own included; weight_version and requests_served above are "
        "its own policy's and the sum.",
    )
    at: float = Field(description="Unix time the heartbeat was written.")


class DrainRequest(ApiModel):
    """Stop pulling work, finish what is in flight, then say Drained."""

    v: Literal[1] = WIRE_VERSION
    pod: str = Field(description="The pod asked to drain.")
    timeout_seconds: float = Field(
        ge=0, description="After this the operator deletes the pod anyway."
    )


class DrainAck(ApiModel):
    v: Literal[1] = WIRE_VERSION
    pod: str
    in_flight: int = Field(ge=0)


class Drained(ApiModel):
    """Published once a draining pod has answered every request it had taken."""

    v: Literal[1] = WIRE_VERSION
    pod: str = Field(description="The drained pod.")
    served: int = Field(ge=0, description="Requests it answered in its life.")
    at: float = Field(description="Unix time.")
