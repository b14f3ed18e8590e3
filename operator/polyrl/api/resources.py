"""The user interface: `RLJob` and `PolicyGroup` (polyrl.dev/v1alpha1), spec and status.

These models are the one source of truth: `polyrl crds` generates the CRDs from them, the
operator and `polyrl run` both parse manifests with them, and what the API server rejects
(bounds, enums, CEL rules) is declared here, next to the field it concerns.

An RLJob lists its policies; the operator creates one PolicyGroup per policy (owned by the
job) holding the policy's trainer and a first rollout pool. A PolicyGroup a user applies
names `jobRef` and `policy` and has no trainer: it only adds rollout capacity elsewhere.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from polyrl.api import frozen, sharedpool
from polyrl.api._version import DEFAULT_IMAGE
from polyrl.api.base import ApiModel, Dns1035Name, Resources, Toleration
from polyrl.api.lora import LoraSpec as LoraSpec
from polyrl.api.model_source import ModelSource as ModelSource
from polyrl.api.model_source import PromptFormat as PromptFormat
from polyrl.api.model_source import pvc_parts as pvc_parts
from polyrl.api.model_source import volume_parts as volume_parts
from polyrl.api.objectives import LossSpec as LossSpec
from polyrl.api.objectives import ResolvedLoss as ResolvedLoss
from polyrl.api.status import Phase as Phase
from polyrl.api.status import PolicyGroupStatus as PolicyGroupStatus
from polyrl.api.status import PolicyStatus as PolicyStatus
from polyrl.api.status import RLJobStatus as RLJobStatus
from polyrl.api.trainer import CheckpointSpec as CheckpointSpec
from polyrl.api.trainer import EvalOn as EvalOn
from polyrl.api.trainer import Optimizer as Optimizer
from polyrl.api.trainer import Source as Source
from polyrl.api.trainer import SourceSpec as SourceSpec
from polyrl.api.trainer import Strategy as Strategy
from polyrl.api.trainer import TrainerSpec as TrainerSpec
from polyrl.api.trainer import UniformGroups as UniformGroups
from polyrl.api.trainer import WhenDeleted as WhenDeleted
from polyrl.api.workflow import JudgeSpec as JudgeSpec
from polyrl.api.workflow import TaskSpec as TaskSpec
from polyrl.api.workflow import WorkflowSpec as WorkflowSpec

# Suffix of the longest generated child name: "-rollout-" plus up to 3 digits.
LONGEST_SUFFIX = len("-rollout-") + 3
MAX_NAME = 63


class Engine(enum.StrEnum):
    """Generation engines behind the rollout worker's engine interface."""

    TORCH = "torch"
    VLLM = "vllm"


class WeightSync(enum.StrEnum):
    SPARSE = "sparse"
    FULL = "full"


class Mode(enum.StrEnum):
    ASYNC = "async"
    SYNC = "sync"


_REPLICAS_MESSAGE = "rollout replicas must satisfy minReplicas <= replicas <= maxReplicas"


class RolloutSpec(ApiModel):
    """An elastic pool of rollout workers serving one policy."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
                    "message": _REPLICAS_MESSAGE,
                }
            ]
        }
    }

    replicas: int = Field(
        1,
        ge=0,
        le=999,
        description="Rollout pods. In an RLJob this only seeds the PolicyGroup; scale the PolicyGroup afterwards.",
    )
    min_replicas: int = Field(0, ge=0, le=999, description="Lower bound for scaling.")
    max_replicas: int = Field(64, ge=0, le=999, description="Upper bound for scaling.")
    engine: Engine = Field(
        Engine.TORCH, description="Generation engine: torch, or vllm (own image; docs/engines.md)."
    )
    max_batch_size: int = Field(32, ge=1, le=4096, description="Sequences generated together.")
    drain_timeout_seconds: int = Field(
        60,
        ge=0,
        le=3600,
        description="How long scale-down waits for a pod to finish its in-flight requests.",
    )
    resources: Resources | None = Field(None, description="Per rollout pod.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels rollout pods must match (region, GPU type)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints rollout pods tolerate."
    )
    served_by: str | None = Field(
        None,
        pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
        max_length=40,
        description="Another policy of the job whose rollout pool serves this one: both train "
        "LoRA adapters (sync: adapter) on the same model, and one engine per replica holds "
        "the base once and each policy's adapter. This policy's PolicyGroup then has no "
        "rollout pods; the serving policy's PolicyGroup holds and scales the pool "
        "(docs/architecture.md, shared pools).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> RolloutSpec:
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(_REPLICAS_MESSAGE)
        return self


class PolicySpec(ApiModel):
    """One policy: its model, trainer (unless frozen), first rollout pool and weight sync."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": frozen.POLICY_RULE, "message": frozen.POLICY_MESSAGE}
            ]
        }
    }

    name: Annotated[
        str, Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", min_length=1, max_length=40)
    ] = Field(description="DNS-1035 label; names the PolicyGroup `<job>-<name>`.")
    model: ModelSource = Field(description="Initial weights and tokenizer.")
    image: str | None = Field(
        None, description="Worker image for this policy (default: the job's)."
    )
    frozen: bool = Field(
        False,
        description="Serve this policy without training it (a judge, a reward model, a fixed "
        "opponent): its PolicyGroup has rollout replicas and a publisher, which puts the "
        "model bundle and its weights (version 0) into the policy's Object Store bucket once, "
        "and no trainer. Workflows call it like any policy; a sample emitted for it is an "
        "error. Needs algorithm.mode async, and at least one policy of the job trained.",
    )
    trainer: TrainerSpec = Field(
        default_factory=TrainerSpec, description="The policy's trainer (none when frozen)."
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="The first rollout pool (seeds the PolicyGroup)."
    )
    weight_sync: WeightSync = Field(
        WeightSync.SPARSE, description="What the trainer publishes: sparse deltas or full weights."
    )
    keyframe_every: int = Field(
        20, ge=1, le=10000, description="A full keyframe every this many versions."
    )
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        le=1048576,
        description="Longest prompt, in this policy's tokens; a longer one is never truncated: its episode is dropped and counted. Always at most the model's context less the generation budget.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="This policy's generation budget (default: its role's, else algorithm.maxNewTokens).",
    )

    @model_validator(mode="after")
    def _frozen(self) -> PolicySpec:
        if problem := frozen.policy_problems(self):
            raise ValueError(problem)
        return self


class AlgorithmSpec(ApiModel):
    """GRPO-family settings shared by the job's policies."""

    mode: Mode = Field(
        Mode.ASYNC, description="async (overlapped) or sync (generate, train, sync, repeat)."
    )
    group_size: int = Field(
        8,
        ge=2,
        le=1024,
        description="Samples per prompt; advantages are normalised within a group.",
    )
    clip_low: float = Field(0.2, ge=0, le=1, description="PPO clip below 1.")
    clip_high: float = Field(0.28, ge=0, le=10, description="PPO clip above 1.")
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the KL term to the initial policy (0: off)."
    )
    max_staleness: int = Field(
        4, ge=0, le=1000, description="Samples older than this many weight versions are dropped."
    )
    tis_cap: float = Field(
        2.0, gt=0, description="Truncation of the importance ratio against behaviour log-probs."
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    shuffle_rewards: bool = Field(
        False,
        description="Control experiment: trainers permute the rewards of each batch before computing advantages, which cuts the link between a completion and its reward; whatever such a run gains does not come from the reward signal.",
    )
    max_new_tokens: int = Field(16, ge=1, le=65536, description="Generation length limit.")
    loss: LossSpec = Field(
        default_factory=LossSpec,
        description="The policy-gradient objective (grpo, gspo, dapo, m2po, cispo) and its parameters.",
    )

    def resolved_loss(self) -> ResolvedLoss:
        """The objective with every default applied (`objectives.LossSpec.resolved`)."""
        return self.loss.resolved(self)


class StopSpec(ApiModel):
    """When the job is done: then phase Succeeded, pods freed, status kept."""

    steps: int | None = Field(
        None, ge=1, description="Stop once every policy reached this trainer step."
    )
    duration_seconds: int | None = Field(
        None, ge=1, description="Stop after this much running time."
    )


class NatsSpec(ApiModel):
    """Which NATS carries the job's traffic."""

    url: str | None = Field(None, description="nats:// URL; default: the operator's.")
    credentials_secret: str | None = Field(
        None,
        description="Secret with key `creds` (a NATS credentials file) or `token`; never copied into status or events.",
    )


_OWN_STEPS_MESSAGE = (
    "a policy's trainer.steps needs algorithm.mode async: sync mode's rounds wait for every policy"
)


class RLJobSpec(ApiModel):
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.algorithm.mode != 'sync' || "
                    "self.policies.all(p, !has(p.trainer.steps))",
                    "message": _OWN_STEPS_MESSAGE,
                },
                {"rule": sharedpool.RULE, "message": sharedpool.MESSAGE},
                {"rule": frozen.JOB_RULE, "message": frozen.JOB_MESSAGE},
                {"rule": frozen.SYNC_RULE, "message": frozen.SYNC_MESSAGE},
            ]
        }
    }

    image: str = Field(
        DEFAULT_IMAGE,
        min_length=1,
        description="Worker image for every pod unless a policy overrides it.",
    )
    policies: list[PolicySpec] = Field(
        min_length=1,
        max_length=16,
        description="The policies trained together; names are unique.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    workflow: WorkflowSpec = Field(
        default_factory=WorkflowSpec, description="Episodes: workflow, task, concurrency."
    )
    algorithm: AlgorithmSpec = Field(
        default_factory=AlgorithmSpec, description="RL algorithm settings."
    )
    stop: StopSpec = Field(default_factory=StopSpec, description="When the job ends.")
    suspend: bool = Field(
        False, description="True frees every pod; false resumes from the last published weights."
    )
    nats: NatsSpec = Field(default_factory=NatsSpec, description="NATS connection.")

    @model_validator(mode="after")
    def _unique_policies(self) -> RLJobSpec:
        names = [p.name for p in self.policies]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate policy names: {', '.join(dupes)}")
        return self

    @model_validator(mode="after")
    def _own_steps_only_async(self) -> RLJobSpec:
        own = any(p.trainer.steps is not None for p in self.policies)
        if own and self.algorithm.mode == Mode.SYNC:
            raise ValueError(_OWN_STEPS_MESSAGE)
        return self

    @model_validator(mode="after")
    def _frozen_policies(self) -> RLJobSpec:
        if problem := frozen.job_problems(self):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _shared_pools(self) -> RLJobSpec:
        for policy in self.policies:
            if policy.rollout.served_by is not None:
                sharedpool.check(self, policy, policy.rollout.served_by)
        return self

    def policy(self, name: str) -> PolicySpec | None:
        return next((p for p in self.policies if p.name == name), None)

    def pool_of(self, name: str) -> str:
        """The policy whose rollout pool serves `name`: its `servedBy`, else itself."""
        policy = self.policy(name)
        served_by = policy.rollout.served_by if policy is not None else None
        return served_by or name

    def served_in_pool(self, name: str) -> list[str]:
        """Every policy `name`'s rollout pool serves: itself first, then those it serves
        (`servedBy: name`); empty if `name` is served by another policy's pool."""
        if self.pool_of(name) != name:
            return []
        return [name] + [p.name for p in self.policies if p.rollout.served_by == name]

    def trained(self) -> list[PolicySpec]:
        """The policies a trainer trains: all but the frozen."""
        return [p for p in self.policies if not p.frozen]

    def steps_of(self, policy: PolicySpec) -> int | None:
        """How many steps `policy` trains: its own `trainer.steps`, else the job's stop.steps
        (None for a frozen policy, which trains none)."""
        if policy.frozen:
            return None
        return policy.trainer.steps if policy.trainer.steps is not None else self.stop.steps

    def all_steps(self) -> dict[str, int] | None:
        """Every trained policy's step budget, or None when some trained policy has none (it
        stops by time)."""
        steps = {}
        for policy in self.trained():
            last = self.steps_of(policy)
            if last is None:
                return None
            steps[policy.name] = last
        return steps


class PolicyGroupSpec(ApiModel):
    job_ref: Dns1035Name = Field(description="The RLJob (same namespace) this group serves.")
    policy: Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=40)] = Field(
        description="Which of the job's policies."
    )
    trainer: TrainerSpec | None = Field(
        None,
        description="Present only in the group the RLJob created for a trained policy; a "
        "capacity-only group, and a frozen policy's, has none.",
    )
    frozen: bool = Field(
        False,
        description="The group the RLJob created for a frozen policy: a publisher puts its "
        "model into the Object Store once, in place of a trainer.",
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec,
        description="This group's rollout pool; `kubectl scale` sets replicas.",
    )
    image: str | None = Field(None, description="Worker image override.")
    nats_url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^(nats|tls)://",
        description="The URL this group's pods reach the job's NATS at, for a pool with an "
        "entry point of its own (another region's load balancer or proxy to the same "
        "servers); default: the job's.",
    )


class Metadata(ApiModel):
    """The parts of ObjectMeta polyrl reads (others are kept by the API server)."""

    model_config = ApiModel.model_config | {"extra": "allow"}

    name: str = Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=MAX_NAME)
    namespace: str = "default"
    uid: str | None = None
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class RLJob(ApiModel):
    """A multi-policy RL training job."""

    api_version: Literal["polyrl.dev/v1alpha1"] = "polyrl.dev/v1alpha1"
    kind: Literal["RLJob"] = "RLJob"
    metadata: Metadata
    spec: RLJobSpec
    status: RLJobStatus = Field(default_factory=RLJobStatus)

    @model_validator(mode="after")
    def _child_names_fit(self) -> RLJob:
        for policy in self.spec.policies:
            longest = len(self.metadata.name) + 1 + len(policy.name) + LONGEST_SUFFIX
            if longest > MAX_NAME:
                raise ValueError(_name_message(self.metadata.name, policy.name, longest))
        return self


def _name_message(job: str, policy: str, longest: int) -> str:
    return (
        f"job name {job!r} with policy {policy!r} makes generated names up to {longest} "
        f"characters; the limit is {MAX_NAME}: shorten the job or policy name"
    )


class PolicyGroup(ApiModel):
    """One policy's pods: its trainer (if any) and an elastic rollout pool."""

    api_version: Literal["polyrl.dev/v1alpha1"] = "polyrl.dev/v1alpha1"
    kind: Literal["PolicyGroup"] = "PolicyGroup"
    metadata: Metadata
    spec: PolicyGroupSpec
    status: PolicyGroupStatus = Field(default_factory=PolicyGroupStatus)
