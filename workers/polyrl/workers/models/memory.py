"""Whether a policy's model fits its trainer: an estimate from the config, before any weights.

The trainer is data-parallel: every rank holds the whole model in float32 (4 bytes a
parameter), its gradients (4) and AdamW's two moments (8): 16 bytes a parameter before
activations, whatever the served dtype. A trainer whose declared memory is below that will be
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


def parameters(config: Any) -> int:
    """The model's parameter count, from its config alone (built on the meta device)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return sum(p.numel() for p in model.parameters())


def trainer_bytes(n_parameters: int) -> int:
    return BYTES_PER_PARAMETER * n_parameters


def declared(policy: PolicySpec) -> int | None:
    """The trainer's declared memory (its limit, else its request), in bytes, if any."""
    resources = policy.trainer.resources
    if resources is None:
        return None
    for quantities in (resources.limits, resources.requests):
        if "memory" in quantities:
            return memory_bytes(quantities["memory"])
    return None


def shortfall(policy: PolicySpec, n_parameters: int) -> str | None:
    """A warning when the trainer's declared memory is below the estimate; else None."""
    have, need = declared(policy), trainer_bytes(n_parameters)
    if have is None or have >= need:
        return None
    return (
        f"policy {policy.name!r}: its model has {n_parameters / 1e6:.1f}M parameters, so each "
        f"trainer rank needs about {need / 2**30:.1f} GiB (16 bytes a parameter: float32 "
        f"weights, gradients and AdamW's moments) before activations, but trainer.resources "
        f"declares {have / 2**30:.1f} GiB of memory"
    )
