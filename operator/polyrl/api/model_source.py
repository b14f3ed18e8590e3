"""A policy's model: where its weights and tokenizer come from, and how prompts meet them.

Apart from `resources` because the paths and prompt format have rules of their own (the
`pvc://` form, checked here and in `plan`'s claim mounts) and `resources` is long enough.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import Field, field_validator, model_validator

from polyrl.api.base import ApiModel


def pvc_parts(uri: str, *, what: str = "model") -> tuple[str, str]:
    """`pvc://claim/a/b` -> ("claim", "a/b"); ValueError unless a claim and a path are named."""
    return volume_parts(uri, "pvc", what=what, inside="<claim>/<path inside the claim>")


def volume_parts(
    uri: str, scheme: str, *, what: str, inside: str = "<name>/<key>"
) -> tuple[str, str]:
    """`<scheme>://name/a/b` -> ("name", "a/b"); ValueError unless both are named and the
    path stays inside the volume."""
    name, _, path = uri.removeprefix(f"{scheme}://").partition("/")
    if not name or not path or ".." in path.split("/") or path.startswith("/"):
        raise ValueError(f"{what} {uri!r}: expected {scheme}://{inside}")
    return name, path


class PromptFormat(enum.StrEnum):
    """How a task's text prompts are shown to a policy's model."""

    TEXT = "text"  # as they are, with the tokenizer's own special tokens (a Llama BOS)
    CHAT = "chat"  # as one user message through the tokenizer's chat template


class ModelSource(ApiModel):
    """Where the trainer reads the initial weights; rollout workers get them from NATS."""

    path: str = Field(
        min_length=1,
        description="A local Hugging Face directory, a GGUF file (`<path>.gguf`, dequantized once into a cached directory), `hf://<org>/<name>[@<revision>]` or `hf://<org>/<name>/<file>.gguf[@<revision>]` (through huggingface_hub's cache; HF_HUB_OFFLINE honoured), `pvc://<claim>/<path>` (the claim is mounted in the trainer's pods), `tiny-bpe://<llama|qwen2|qwen3>/<name>` (a tiny model with a BPE tokenizer, built locally) or `tiny-llama://<name>` (the quick start's character-tokenizer model).",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        description="What rollouts compute in. Weight sync always carries bfloat16 (its deltas are bit-exact in it), so rollouts hold bfloat16 weights: `float32` makes the torch engine compute in float32 over them (on a CPU it does for bfloat16 too); `float16` leaves the engine's default. The trainer trains in float32.",
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="The SHA-256 of a GGUF `path`, checked before work starts: a file that does not match fails the job, saying so.",
    )
    tokenizer: str | None = Field(
        None, description="Tokenizer location when it differs from `path`."
    )
    prompt_format: PromptFormat = Field(
        PromptFormat.TEXT,
        description="text: task prompts are encoded as they are; chat: as one user message through the tokenizer's chat template, with the generation prompt (warm-up, evaluation and RL alike). Chat messages a workflow sends always go through the template.",
    )

    @field_validator("path", "tokenizer")
    @classmethod
    def _pvc_names_a_claim_and_a_path(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("pvc://"):
            pvc_parts(value)
        return value

    @model_validator(mode="after")
    def _sha256_is_for_gguf_files(self) -> ModelSource:
        if self.sha256 is not None and not self.path.lower().endswith(".gguf"):
            raise ValueError(
                f"model.sha256 is checked for GGUF files only; {self.path!r} is not a .gguf path"
            )
        return self
