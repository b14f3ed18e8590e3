"""`algorithm.loss`: which policy-gradient objective the trainers optimise, and its settings.

Every objective weighs a token's log-probability gradient by its advantage and by a ratio of
policies, and differs in which ratio it clips or masks and at what level (token or sequence):

- current/proximal: the policy being optimised against the trainer's own before the batch's
  first update. Exactly 1 at the first update, so a clip on it binds only from the second
  optimizer step on one batch (`trainer.miniBatches` or `trainer.updatesPerBatch` > 1).
- proximal/behaviour: the trainer against the rollout engine that sampled (staleness and
  kernel differences). Known before any update, so it binds from the first.
- current/behaviour: the product of the two.

The parameters an objective does not use are refused by the API server (a message naming the
field), so a manifest never carries a setting that silently does nothing.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import Field, model_validator

from polyrl.api.base import ApiModel


class LossName(enum.StrEnum):
    """The objectives on offer; docs/algorithms.md has each one's formula and paper."""

    GRPO = "grpo"  # decoupled PPO with truncated IS (clips current/proximal, token-level)
    GSPO = "gspo"  # sequence-level ratio and clip (current/proximal)
    DAPO = "dapo"  # decoupled PPO, clip-higher, token-mean, overlong filter and penalty
    M2PO = "m2po"  # masks tokens until the second moment of log(current/behaviour) is bounded
    CISPO = "cispo"  # clipped, detached IS weight (current/behaviour) on every token


class Aggregation(enum.StrEnum):
    """How per-token losses become the step's loss."""

    TOKEN_MEAN = "token-mean"  # every trained token of the step weighs the same
    SEQUENCE_MEAN = "seq-mean-token-mean"  # each sequence's token mean, then the mean
    CONSTANT = "constant"  # token sum / (sequences x maxNewTokens): Dr. GRPO


# Defaults per objective: (clipLow, clipHigh, aggregation). GSPO's ratio is a geometric mean
# over a sequence, so its useful clip range is three orders of magnitude narrower (GSPO §5).
DEFAULTS: dict[LossName, tuple[float, float, Aggregation]] = {
    LossName.GRPO: (0.2, 0.28, Aggregation.TOKEN_MEAN),
    LossName.GSPO: (3e-4, 4e-4, Aggregation.SEQUENCE_MEAN),
    LossName.DAPO: (0.2, 0.28, Aggregation.TOKEN_MEAN),
    LossName.M2PO: (0.0, 0.0, Aggregation.TOKEN_MEAN),
    LossName.CISPO: (1.0, 0.28, Aggregation.TOKEN_MEAN),
}
CLIPPED = (LossName.GRPO, LossName.GSPO, LossName.DAPO, LossName.CISPO)

RULES = [
    (
        "!has(self.m2Threshold) || self.name == 'm2po'",
        "algorithm.loss.m2Threshold applies to name m2po only",
    ),
    (
        "(!has(self.clipLow) && !has(self.clipHigh)) || self.name != 'm2po'",
        "algorithm.loss.clipLow and clipHigh do not apply to m2po (it masks, never clips)",
    ),
    (
        "(!has(self.overlongBufferTokens) && !has(self.overlongPenalty) && "
        "!has(self.overlongFilter)) || self.name == 'dapo'",
        "algorithm.loss.overlongBufferTokens, overlongPenalty and overlongFilter apply to "
        "name dapo only",
    ),
]


class LossSpec(ApiModel):
    """The objective and its parameters (`algorithm.loss`)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [{"rule": r, "message": m} for r, m in RULES]
        }
    }

    name: LossName = Field(
        LossName.GRPO,
        description="grpo: decoupled PPO with truncated importance sampling, token-level (the default). gspo: sequence-level ratio and clipping. dapo: grpo's clip-higher with DAPO's overlong filtering and soft overlong penalty (its dynamic sampling is trainer.uniformGroups: refill). m2po: no clip; masks the tokens with the largest squared log(current/behaviour) until their mean is at most m2Threshold. cispo: every token trains, weighted by its clipped, detached current/behaviour ratio. docs/algorithms.md gives each formula.",
    )
    clip_low: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Clip below 1 of the objective's ratio; default algorithm.clipLow for grpo and dapo, 3e-4 for gspo, 1 (no lower bound) for cispo.",
    )
    clip_high: float | None = Field(
        None,
        ge=0,
        le=100,
        description="Clip above 1 of the objective's ratio; default algorithm.clipHigh for grpo and dapo, 4e-4 for gspo, 0.28 for cispo.",
    )
    aggregation: Aggregation | None = Field(
        None,
        description="token-mean (each trained token of the step weighs the same; default but for gspo), seq-mean-token-mean (each sequence weighs the same; gspo's default), constant (the token sum over sequences x maxNewTokens: Dr. GRPO's length-unbiased normaliser).",
    )
    advantage_std: bool = Field(
        True,
        description="Divide each group's centred rewards by the group's standard deviation (GRPO); false keeps raw differences (Dr. GRPO: the division over-weights nearly solved prompts).",
    )
    m2_threshold: float | None = Field(
        None,
        gt=0,
        le=10,
        description="m2po: the bound on the mean squared log(current/behaviour) of the tokens a clip would act on; default 0.04 (the paper's).",
    )
    overlong_filter: bool | None = Field(
        None,
        description="dapo: samples cut at maxNewTokens (finish reason length) are left out of the loss (default true).",
    )
    overlong_buffer_tokens: int | None = Field(
        None,
        ge=0,
        le=65536,
        description="dapo: the soft overlong penalty's buffer: a completion longer than maxNewTokens minus this loses up to overlongPenalty, linearly (default maxNewTokens / 4; 0: no penalty).",
    )
    overlong_penalty: float | None = Field(
        None,
        ge=0,
        le=100,
        description="dapo: the reward lost at the end of the overlong buffer (default 1).",
    )

    @model_validator(mode="after")
    def _applies(self) -> LossSpec:
        for (_, message), holds in zip(RULES, self._rule_checks(), strict=True):
            if not holds:
                raise ValueError(message)
        return self

    def _rule_checks(self) -> list[bool]:
        """The API server's `RULES`, in the same order, on the model."""
        dapo_only = (self.overlong_buffer_tokens, self.overlong_penalty, self.overlong_filter)
        return [
            self.m2_threshold is None or self.name == LossName.M2PO,
            (self.clip_low is None and self.clip_high is None) or self.name != LossName.M2PO,
            all(x is None for x in dapo_only) or self.name == LossName.DAPO,
        ]

    def resolved(self, algorithm: Any) -> ResolvedLoss:
        """Every parameter filled in: the objective's defaults, or `algorithm`'s clip
        settings for the PPO objectives (their long-standing home)."""
        low, high, aggregation = DEFAULTS[self.name]
        if self.name in (LossName.GRPO, LossName.DAPO):
            low, high = algorithm.clip_low, algorithm.clip_high
        max_new = int(algorithm.max_new_tokens)
        dapo = self.name == LossName.DAPO
        buffer = self.overlong_buffer_tokens
        return ResolvedLoss(
            name=self.name,
            clip_low=low if self.clip_low is None else self.clip_low,
            clip_high=high if self.clip_high is None else self.clip_high,
            tis_cap=float(algorithm.tis_cap),
            aggregation=self.aggregation or aggregation,
            advantage_std=self.advantage_std,
            m2_threshold=0.04 if self.m2_threshold is None else self.m2_threshold,
            max_new_tokens=max_new,
            overlong_filter=dapo and self.overlong_filter is not False,
            overlong_buffer=(max_new // 4 if buffer is None else min(buffer, max_new))
            if dapo
            else 0,
            overlong_penalty=1.0 if self.overlong_penalty is None else self.overlong_penalty,
        )


class ResolvedLoss(ApiModel):
    """`LossSpec` with every default applied: what the trainer's objective reads."""

    name: LossName
    clip_low: float
    clip_high: float
    tis_cap: float
    aggregation: Aggregation
    advantage_std: bool
    m2_threshold: float
    max_new_tokens: int
    overlong_filter: bool
    overlong_buffer: int
    overlong_penalty: float
