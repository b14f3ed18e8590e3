"""Whether a policy's model fits its trainer: an estimate from the config, before any weights.

The trainer is data-parallel: every rank holds the whole model in float32 (4 bytes a
parameter), its gradients (4) and AdamW's two moments (8): 16 bytes a parameter before
activations, whatever the served dtype. Under LoRA only the adapters have gradients and
moments: 4 bytes a base parameter and 16 an adapter's. A trainer whose declared memory is below that will be
killed for memory after minutes of loading and warming up, so the estimate is checked first
and a shortfall is a warning naming the policy (a warning, not an error: the declared figure
may be a request below what the node really gives).
"""

from __future__ import annotations

from typing import Any

import torch

from polyrl.api.base import memory_bytes
from polyrl.api.resources import PolicySpec

BYTES_PER_PARAMETER = 16  # float32 weights + gradients + AdamW's two moments
BYTES_PER_FROZEN = 4  # float32 weights alone (a LoRA policy's base)


def meta_model(config: Any) -> Any:
    """The model `config` describes, built on the meta device: shapes and names, no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]


def parameters(config: Any) -> int:
    """The model's parameter count, from its config alone (built on the meta device)."""
    return sum(p.numel() for p in meta_model(config).parameters())


def trainer_bytes(n_parameters: int, trainable: int | None = None) -> int:
    """Bytes a trainer rank needs before activations; `trainable` of the `n_parameters`
    train (all of them when None)."""
    trained = n_parameters if trainable is None else trainable
    frozen = n_parameters - trained
    return BYTES_PER_PARAMETER * trained + BYTES_PER_FROZEN * frozen


def declared(policy: PolicySpec) -> int | None:
    """The trainer's declared memory (its limit, else its request), in bytes, if any."""
    resources = policy.trainer.resources
    if resources is None:
        return None
    for quantities in (resources.limits, resources.requests):
        if "memory" in quantities:
            return memory_bytes(quantities["memory"])
    return None


def shortfall(policy: PolicySpec, n_parameters: int, trainable: int | None = None) -> str | None:
    """A warning when the trainer's declared memory is below the estimate; else None."""
    have, need = declared(policy), trainer_bytes(n_parameters, trainable)
    if have is None or have >= need:
        return None
    how = (
        "16 bytes a parameter: float32 weights, gradients and AdamW's moments"
        if trainable is None
        else f"4 bytes a frozen parameter, 16 for each of the {trainable / 1e6:.1f}M trained"
    )
    return (
        f"policy {policy.name!r}: its model has {n_parameters / 1e6:.1f}M parameters, so each "
        f"trainer rank needs about {need / 2**30:.1f} GiB ({how}) before activations, but "
        f"trainer.resources declares {have / 2**30:.1f} GiB of memory"
    )
