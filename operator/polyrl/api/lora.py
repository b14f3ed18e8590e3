"""LoRA settings of a policy's trainer (`trainer.lora`): the adapters' shape and where they go.

Kept apart from the rest of the trainer's settings: what LoRA means for training, sync and
export is in docs/models.md ("LoRA").
"""

from __future__ import annotations

import enum

from pydantic import Field

from polyrl.api.base import ApiModel


class LoraSync(enum.StrEnum):
    """What a LoRA policy's trainer sends its rollout pools."""

    ADAPTER = "adapter"
    MERGED = "merged"


class LoraSpec(ApiModel):
    """Low-rank adapters (LoRA): the trainer trains `rank`-wide adapters on the target layers
    and leaves the base weights frozen, so optimizer state and gradients are the adapters'
    alone. Rollout pools are sent the frozen base once and then each version's adapter
    (`sync`), or the merged weights as for full training."""

    rank: int = Field(16, ge=1, le=1024, description="The adapters' rank r.")
    alpha: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="The scale numerator: an adapter's update is (alpha / rank) * B A. "
        "Default 2 x rank, the common choice (a scale of 2 at any rank).",
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapters' input while training. Default 0: in RL the "
        "trainer's log-probs are compared with the rollout engine's (importance ratios), and "
        "dropout would make them differ for no reason.",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        min_length=1,
        max_length=64,
        description="The layers that get adapters: module names or name suffixes (q_proj, "
        "v_proj, ...), or all-linear: every linear layer of the attention and MLP blocks "
        "but not the output head (and never the embeddings), the layers vLLM serves LoRA on. "
        "Names that match no layer of the model are refused when the trainer starts.",
    )

    sync: LoraSync = Field(
        LoraSync.ADAPTER,
        description="What rollout pools are sent each version. adapter (default): the adapters "
        "alone (megabytes, against the model's share that changed for merged weights); the "
        "pool loads the frozen base once and serves base + adapter. merged: the merged "
        "model's weights as sparse deltas, as for full training, for engines or pools that "
        "serve no adapters.",
    )

    @property
    def scale_alpha(self) -> int:
        return self.alpha if self.alpha is not None else 2 * self.rank
