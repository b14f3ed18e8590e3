"""The workflow's part of an RLJob: how episodes run (`WorkflowSpec`), the task they sample
(`TaskSpec`) and how rewards a policy gives behave (`JudgeSpec`).

Kept apart from `resources`, which holds the policies and the job around them and re-exports
these; what the API server refuses is declared next to each field, as there.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, WithJsonSchema, model_validator

from polyrl.api import taskparams
from polyrl.api.base import ApiModel
from polyrl.api.verifier import VerifierSpec


class TaskSpec(ApiModel):
    """The task episodes sample from: a built-in generator, a data file or `module:function`."""

    # A dataset task's params are checked by the API server too (polyrl.api.taskparams).
    model_config = ApiModel.model_config | {"json_schema_extra": taskparams.cel_rules()}

    name: str = Field(
        "arithmetic",
        min_length=1,
        description="`arithmetic`, `countdown`, `dataset` (a data file: docs/datasets.md) or `module:function`.",
    )
    params: Annotated[dict[str, taskparams.Param], WithJsonSchema(taskparams.schema())] = Field(
        default_factory=dict,
        description="Task parameters, e.g. {digits: 2}; a dataset's are declared below (docs/datasets.md), any other key is the task's own.",
    )
    held_out: int = Field(1000, ge=0, description="Size of the fixed held-out split.")
    seed: int = Field(0, description="Seed of the task generator.")

    @model_validator(mode="after")
    def _params(self) -> TaskSpec:
        if found := taskparams.problems(self.name, self.params):
            raise ValueError("; ".join(found))
        return self


class JudgeSpec(ApiModel):
    """How a workflow's rewards that ask a policy (LLM-as-judge) handle its failures."""

    timeout_seconds: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="How long one verdict may take (the judge's generation, queueing "
        "included); past it the verdict has failed.",
    )
    temperature: float = Field(
        0.0,
        ge=0,
        le=10,
        description="Sampling temperature of the verdicts (0: greedy, the judge's most likely "
        "answer; they are never trained on, so nothing needs them sampled).",
    )
    fallback_score: float | None = Field(
        None,
        description="The reward used when a verdict fails (the judge timed out, its pool "
        "failed, or its answer parses as no verdict), counted apart (heartbeat and metric "
        "`judge_fallbacks`). Unset: the episode is dropped and counted (reason `judge`), so "
        "no sample is trained on a reward nobody gave.",
    )


class WorkflowSpec(ApiModel):
    """How episodes run across policies."""

    name: str = Field(
        "single",
        min_length=1,
        description="`single`, `solver-verifier`, or a Python entry point `module:function`.",
    )
    task: TaskSpec = Field(default_factory=TaskSpec, description="Task and data set.")
    episodes_in_flight: int = Field(
        64, ge=1, le=100000, description="Episodes running at once, over all runners."
    )
    replicas: int = Field(1, ge=1, le=256, description="Workflow-runner pods.")
    verifier: VerifierSpec | None = Field(
        None,
        description="solver-verifier: the verifier's chat template and verdict parser "
        "(docs/workflows.md); unset: the built-in format for generated tasks.",
    )
    judge: JudgeSpec = Field(
        default_factory=JudgeSpec,
        description="Rewards a policy gives (Episode.judge: a frozen judge or reward model): "
        "their timeout and what a failed verdict does (docs/workflows.md).",
    )
    max_turns: int = Field(
        8,
        ge=1,
        le=1000,
        description="Replies a policy gives in one conversation of a multi-turn workflow; an "
        "episode that asks for more is dropped and counted (reason `turns`).",
    )
    max_context_tokens: int | None = Field(
        None,
        ge=2,
        le=1048576,
        description="Tokens one conversation may hold, its replies included: a reply's budget "
        "is cut to what is left, and an episode with no room left is dropped and counted "
        "(reason `context`). Unset: the model's context is the limit.",
    )
