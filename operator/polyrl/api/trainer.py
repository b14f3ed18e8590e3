"""A policy's trainer in an RLJob (`TrainerSpec`) and its parts: optimizer, warm-up and
evaluation sources, checkpoint storage, what to do with uniform groups.

Kept apart from `resources`, which holds the policies and the job around them and re-exports
these; what the API server refuses is declared next to each field, as there.
"""

from __future__ import annotations

import enum

from pydantic import Field, model_validator

from polyrl.api.base import ApiModel, Dns1035Name, Quantity, Resources, Toleration
from polyrl.api.lora import LoraSpec


class UniformGroups(enum.StrEnum):
    """What a policy's trainer does with groups whose samples all got the same reward."""

    KEEP = "keep"
    SKIP = "skip"
    REFILL = "refill"


class Optimizer(ApiModel):
    """AdamW settings of a policy's trainer."""

    lr: float = Field(1e-5, gt=0, le=1, description="Learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        le=100000,
        description="RL steps over which the learning rate ramps linearly up to lr. Adam's first steps move every weight by about lr whatever the gradient, which right after a supervised warm start knocks a small model's accuracy down before RL lifts it.",
    )


class Strategy(enum.StrEnum):
    """How a policy's trainer ranks share the model."""

    DDP = "ddp"  # every rank holds the whole model; gradients averaged
    FSDP2 = "fsdp2"  # each decoder layer and the root sharded over the ranks


_FSDP2_LORA = "trainer.strategy fsdp2 does not support trainer.lora (adapters are small: train them data-parallel with strategy ddp)"
_ASYNC_WRITES = "trainer.checkpoint.asyncWrites needs trainer.strategy fsdp2 (a ddp checkpoint is rank 0's whole model, written synchronously)"
_FSDP2_EVAL = "trainer.strategy fsdp2 needs trainer.evalOn: rollout when trainer.evalEvery > 0 (rank 0 alone cannot decode on sharded weights; the policy's rollout pool evaluates instead)"


class Source(enum.StrEnum):
    """Where a policy's warm-up examples, or its evaluation, come from."""

    WORKFLOW = "workflow"  # what the workflow declares for the policy (a function: nothing)
    TASK = "task"  # the task's problems and answers; its held-out split, greedy accuracy
    NONE = "none"


class SourceSpec(ApiModel):
    source: Source = Field(
        Source.WORKFLOW,
        description="workflow: what the job's workflow declares for this policy (a plain function workflow declares nothing); task: the task's own problems and answers (warm-up) or greedy accuracy on its held-out split (evaluation); none: nothing.",
    )


class EvalOn(enum.StrEnum):
    """Where a policy's held-out answers are generated."""

    TRAINER = "trainer"  # greedy decoding on rank 0, between steps
    ROLLOUT = "rollout"  # requests to the policy's own rollout pool


class WhenDeleted(enum.StrEnum):
    """What becomes of an operator-made checkpoint claim when its RLJob is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


class CheckpointSpec(ApiModel):
    """Where a policy's trainer checkpoints: a PersistentVolumeClaim, so a replaced trainer
    pod resumes where the last one stopped, and the trained model outlives the job's pods.
    The operator creates the claim `<job>-<policy>-checkpoints` unless `claimName` names
    one; checkpoints go under `<RLJob uid>/` in it, so a later job of the same name never
    resumes this one's."""

    claim_name: Dns1035Name | None = Field(
        None,
        description="An existing PersistentVolumeClaim to use; the operator then creates none and never deletes it.",
    )
    storage_class_name: str | None = Field(
        None,
        description="StorageClass of the claim the operator creates (default: the cluster's default class).",
    )
    size: Quantity = Field("10Gi", description="Size of the claim the operator creates.")
    when_deleted: WhenDeleted = Field(
        WhenDeleted.RETAIN,
        description="Retain keeps an operator-made claim (and the trained model) when the RLJob is deleted; Delete removes it with the job.",
    )
    async_writes: bool = Field(
        False,
        description="With strategy fsdp2: each rank copies its shards (weights, AdamW state, KL anchor) to host memory and writes them in the background while training goes on (torch.distributed.checkpoint's async_save); the checkpoint is swapped into place once every rank's files are written, so a partial one is never resumed, and the next save or the trainer's end waits for it. Costs a host copy of the rank's training state, kept between saves; worth it where a save takes long beside a step (large models on accelerators). Off: the step waits for the save. Not with strategy ddp (rank 0 writes the whole model synchronously).",
    )


_EVAL_SAMPLES_MESSAGE = "evalSamples needs evalOn: rollout (the trainer evaluates greedily)"


class TrainerSpec(ApiModel):
    """The policy's trainer: torchrun with `replicas` nodes of `nprocPerNode` ranks."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.evalSamples == 0 || self.evalOn == 'rollout'",
                    "message": _EVAL_SAMPLES_MESSAGE,
                },
                {"rule": "self.strategy != 'fsdp2' || !has(self.lora)", "message": _FSDP2_LORA},
                {
                    "rule": "self.strategy != 'fsdp2' || self.evalEvery == 0 || self.evalOn == 'rollout'",
                    "message": _FSDP2_EVAL,
                },
                {
                    "rule": "self.strategy == 'fsdp2' || !has(self.checkpoint) || !has(self.checkpoint.asyncWrites) || !self.checkpoint.asyncWrites",
                    "message": _ASYNC_WRITES,
                },
            ]
        }
    }

    replicas: int = Field(1, ge=1, le=64, description="torchrun nodes (pods).")
    nproc_per_node: int = Field(1, ge=1, le=16, description="Ranks per trainer pod.")
    strategy: Strategy = Field(
        Strategy.DDP,
        description="How the ranks (replicas x nprocPerNode) share the model. ddp (the default): every rank holds the whole model, its gradients and its AdamW state (about 16 bytes a parameter) and gradients are averaged; simplest and fastest while that fits one rank. fsdp2: each decoder layer and the root are sharded over the ranks (torch's fully_shard), so each holds about 1/N of the weights, gradients and optimizer state and gathers one layer at a time; for models whose training state does not fit one rank. Same steps, same weights as ddp (to rounding). Not with trainer.lora; needs evalOn: rollout when evalEvery > 0.",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers' gradient checkpointing): less memory for long sequences, about a third more compute. Either strategy.",
    )
    batch_size: int = Field(64, ge=1, description="Samples per optimizer step, over all ranks.")
    micro_batch_size: int = Field(
        8,
        ge=1,
        description="Samples per forward/backward pass, each padded to the longest (unless microBatchTokens is set).",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        le=1048576,
        description="Pack samples into micro-batches of at most this many tokens (prompt and completion), run as one row whose attention never crosses a sample boundary, instead of padding microBatchSize samples to the longest: much less compute when lengths have a long tail. A sample longer than the budget runs alone.",
    )
    optimizer: Optimizer = Field(default_factory=Optimizer, description="AdamW settings.")
    steps: int | None = Field(
        None,
        ge=1,
        description="This policy's own number of training steps; the job's stop.steps when unset. A policy that learns faster, or costs more per step, can stop early and leave the machines to the others (async mode only).",
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        le=16,
        description="Optimizer steps taken on each batch (PPO's epochs), each clipped against the trainer's log-probs before the first. Generation usually takes longer than training, so a trainer that would wait for its next batch gets more out of this one instead; the job's steps still count batches.",
    )
    mini_batches: int = Field(
        1,
        ge=1,
        le=64,
        description="Optimizer steps per pass over a batch: the batch is split into this many mini-batches (verl's ppo_mini_batch_size, as a count), each one optimizer step, so from the second on the current policy has moved from the proximal one and the objective's clip binds. Each mini-batch's loss is normalised over its own tokens or sequences. 1: one step on the whole batch.",
    )
    uniform_groups: UniformGroups = Field(
        UniformGroups.KEEP,
        description="Groups whose samples all got the same reward (all right, or all wrong) have zero GRPO advantages: they cost compute but add no policy gradient (only the KL term's pull, when klCoef > 0). keep: train on them anyway. skip: the trainer leaves them out of each batch and averages the loss over the other samples' tokens. refill (async mode; skip in sync mode): the workflow runner does not send them (at most refillLimit in a row), so the batches fill with groups that differ, as in DAPO's dynamic sampling; it costs more generation per step, and a policy whose samples come only from some episodes (a verifier's) can wait long for a batch. The trainer's reward figure covers its whole batch, which with refill holds only the groups that differ; trained_fraction is the share of the batch it trained on.",
    )
    refill_limit: int = Field(
        5,
        ge=0,
        le=64,
        description="uniformGroups refill: at most this many of the policy's groups rewarded alike are left out in a row; the next is sent whatever its rewards and the trainer trains on what its batch holds (trained_fraction says how much). Generation costs at most refillLimit + 1 times as much per group sent, so a model that gets everything right, or nothing, still takes its steps.",
    )
    checkpoint_every: int = Field(50, ge=1, description="Steps between checkpoints.")
    ledger: bool = Field(
        False,
        description="Write, for every step, the ids of the trajectories it trained on and of those it dropped as too old to ledger.jsonl in the trainer's directory (beside its checkpoint, so it survives the pod): an audit of what each step learned from, which the fault-injection suite reconciles against the trajectory stream. About 40 bytes per sample.",
    )
    warmup: SourceSpec = Field(
        default_factory=SourceSpec,
        description="Where the supervised warm-up's examples come from (single and solver-verifier declare them for each of their policies).",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        le=100000,
        description="Supervised warm-up steps before RL, on the examples of `warmup` (GRPO needs some correct samples to learn from): in the built-in workflows, the task's answers for the answering policy and worked verdicts (the reference answer, then y or n) for a verifier. Refused where the policy has no warm-up examples.",
    )
    warmup_target_accuracy: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Stop the warm-up early once greedy accuracy on training problems (a verifier: right verdicts) reaches this (checked every 10 steps; warmupSteps stays the limit). Where to hand over to RL depends on how fast the model learns, which varies from run to run; a target makes the starting point reproducible.",
    )
    warmup_lr: float = Field(
        3e-3,
        gt=0,
        le=1,
        description="Learning rate of the supervised warm-up (AdamW, weight decay 0.1). The "
        "default suits the small models built from scratch for tests and examples; a "
        "pretrained model wants about 1e-5 to 1e-4, or it forgets what it knew.",
    )
    warmup_batch_size: int = Field(
        32,
        ge=1,
        le=4096,
        description="Problems per supervised warm-up step. A small model's accuracy climbs late and then steeply, after a number of steps that varies several-fold with the seed; larger batches often bring the climb in fewer steps, each of which costs more.",
    )
    eval: SourceSpec = Field(
        default_factory=SourceSpec,
        description="How the policy is evaluated (single and solver-verifier declare it for each of their policies).",
    )
    eval_every: int = Field(
        0,
        ge=0,
        description="Steps between held-out evaluations of the policy, by `eval` (0: never; also before and after the warm-up when not 0). Refused where the policy has no evaluation.",
    )
    eval_on: EvalOn = Field(
        EvalOn.TRAINER,
        description="Where held-out answers are generated: trainer (greedy decoding on the trainer's rank 0, between steps; cheap for small models) or rollout (requests to the policy's own rollout pool, served at the version being evaluated by its engine, batched like training requests; the before-warm-up figures stay on the trainer, since the pool never serves those weights).",
    )
    eval_samples: int = Field(
        0,
        ge=0,
        le=64,
        description="With evalOn: rollout, also sample this many completions per held-out problem at algorithm.temperature and report pass_at_1 (their mean reward) and pass_at_k (any of them right); 0: greedy accuracy only.",
    )
    lora: LoraSpec | None = Field(
        None,
        description="Train low-rank adapters instead of every weight (LoRA; absent: full "
        "training). The learning rate usually wants to be about 10x full training's "
        "(optimizer.lr), since adapters start at zero and move the model through few "
        "weights; the warm-up trains the same adapters; the KL anchor (klCoef) is the base "
        "model with the adapters off, not a second copy; checkpoints hold the adapters and "
        "their optimizer state; polyrl export writes the merged model (--adapter: the adapter "
        "alone, in PEFT's format).",
    )
    restart_limit: int = Field(
        3, ge=0, le=100, description="Trainer restarts allowed before the policy is marked Failed."
    )
    rendezvous_timeout_seconds: int = Field(
        300,
        ge=10,
        le=3600,
        description="With several trainer pods: how long torchrun waits for the gang to meet (its rendezvous) before the pods fail and the trainer is restarted, with the cause in the PolicyGroup's conditions.",
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="Checkpoint storage on a cluster (polyrl run keeps checkpoints in its run directory).",
    )
    resources: Resources | None = Field(None, description="Per trainer pod.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels trainer pods must match."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints trainer pods tolerate."
    )

    @model_validator(mode="after")
    def _eval_samples(self) -> TrainerSpec:
        if self.eval_samples and self.eval_on != EvalOn.ROLLOUT:
            raise ValueError(_EVAL_SAMPLES_MESSAGE)
        return self

    @model_validator(mode="after")
    def _sharded(self) -> TrainerSpec:
        if self.strategy == Strategy.FSDP2 and self.lora is not None:
            raise ValueError(_FSDP2_LORA)
        if self.strategy == Strategy.FSDP2 and self.eval_every and self.eval_on != EvalOn.ROLLOUT:
            raise ValueError(_FSDP2_EVAL)
        if self.strategy != Strategy.FSDP2 and self.checkpoint.async_writes:
            raise ValueError(_ASYNC_WRITES)
        return self
