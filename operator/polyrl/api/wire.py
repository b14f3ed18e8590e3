"""Data-plane wire messages: generation requests and responses, trajectories, dead letters.

Every message carries `v` (the wire version); a receiver that meets an unknown version or
a malformed body dead-letters it (see `DeadLetter`) and goes on, never crashing. Requests
travel through the policy's JetStream work queue with their `id` as the message id, and are
acked only after the response went out; trajectories carry their `id` as the message id too,
so a retried publish is de-duplicated by the stream instead of doubling a sample.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, model_validator

from polyrl.api.base import ApiModel

# 2: requests carry prompt token ids (the workflow runner tokenises), trajectories a loss mask.
WIRE_VERSION: Final = 2
# 3: trajectories say how generation ended (`finish_reason`); version 2 ones are still read.
TRAJECTORY_VERSION: Final = 3
# Rewards and log-probs the trainer computes with: NaN or infinity would poison a whole step.
Finite = Annotated[float, Field(allow_inf_nan=False)]


class GenerationRequest(ApiModel):
    """Ask a policy's rollout pool for `n` completions of one prompt."""

    v: Literal[2] = WIRE_VERSION
    id: str = Field(min_length=1, description="Unique request id (also the JetStream message id).")
    episode_id: str = Field(description="The episode this request belongs to.")
    policy: str = Field(description="The policy asked.")
    prompt_tokens: list[int] = Field(
        min_length=1,
        description="The prompt as the policy's token ids (the workflow runner encoded it with "
        "the policy's own tokenizer and chat template; see polyrl.workers.prompts).",
    )
    n: int = Field(1, ge=1, le=1024, description="Completions wanted (a GRPO group).")
    max_new_tokens: int = Field(16, ge=1, le=65536)
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="0 means greedy.")
    min_version: int = Field(
        0,
        ge=0,
        description="Serve only with weights at least this new: sync mode's round, async "
        "mode's staleness bound for the batch the samples will land in.",
    )
    reply_to: str = Field(min_length=1, description="Subject the response is published to.")


class Completion(ApiModel):
    tokens: list[int] = Field(description="Generated token ids (the prompt excluded).")
    logprobs: list[Finite] = Field(description="Behaviour log-prob of each generated token.")
    text: str = Field(description="Decoded completion.")
    finish_reason: Literal["stop", "length"]


class GenerationResponse(ApiModel):
    v: Literal[2] = WIRE_VERSION
    id: str = Field(description="The request's id.")
    pod: str = Field(description="Which rollout worker answered.")
    weight_version: int = Field(ge=0, description="Weights the completions were sampled with.")
    prompt_tokens: list[int] = Field(description="The request's prompt ids, echoed.")
    completions: list[Completion] = Field(default_factory=list)
    error: str | None = Field(None, description="Set when the request could not be served.")


class Trajectory(ApiModel):
    """One sample for one policy's trainer. Version 3 adds `finish_reason`; a version 2
    trajectory (an older runner's) is still read, with the reason unknown."""

    v: Literal[2, 3] = TRAJECTORY_VERSION
    id: str = Field(min_length=1, description="Unique sample id (the JetStream message id).")
    episode_id: str
    group_id: str = Field(description="Samples sharing a group are normalised together (GRPO).")
    policy: str
    prompt_tokens: list[int]
    tokens: list[int] = Field(description="Completion tokens.")
    logprobs: list[Finite] = Field(description="Behaviour log-probs, aligned with tokens.")
    loss_mask: list[bool] | None = Field(
        None,
        description="Per completion token, whether it is trained on (False: text the policy did "
        "not write, such as a tool's output in a multi-turn episode); None: every token.",
    )
    reward: Finite
    weight_version: int = Field(ge=0, description="Weights that generated the sample.")
    created_at: float = Field(description="Unix time.")
    finish_reason: Literal["stop", "length"] | None = Field(
        None,
        description="length: a reply of the sample was cut at maxNewTokens (DAPO's overlong "
        "filter leaves it out of the loss); stop: none was; None: not said (version 2).",
    )

    @model_validator(mode="after")
    def _aligned(self) -> Trajectory:
        if len(self.logprobs) != len(self.tokens):
            raise ValueError(f"{len(self.logprobs)} log-probs for {len(self.tokens)} tokens")
        if self.loss_mask is not None and len(self.loss_mask) != len(self.tokens):
            raise ValueError(f"a loss mask of {len(self.loss_mask)} for {len(self.tokens)} tokens")
        return self


class DeadLetter(ApiModel):
    """A message a worker could not use, kept with the reason for a human to look at."""

    v: Literal[2] = WIRE_VERSION
    subject: str
    worker: str
    error: str
    data: str = Field(
        description="The original body (UTF-8, replaced where invalid), up to 64 KiB."
    )
    at: float
