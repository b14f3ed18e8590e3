"""Whether a policy's model fits its trainer: an estimate from the config, before any weights.

Data-parallel (`trainer.strategy: ddp`), every rank holds the whole model in float32 (4 bytes
a parameter), its gradients (4) and AdamW's two moments (8): 16 bytes a parameter before
activations, whatever the served dtype. Under LoRA only the adapters have gradients and
moments: 4 bytes a base parameter and 16 an adapter's. Sharded (`fsdp2`), each of the N ranks
holds 1/N of the 16 bytes, plus the largest decoder layer gathered whole for its forward and
backward (its float32 weights and gradients). A pod holds `nprocPerNode` ranks. A trainer pod
whose declared memory is below that will be
killed for memory after minutes of loading and warming up, so the estimate is checked first
and a shortfall is a warning naming the policy (a warning, not an error: the declared figure
may be a request below what the node really gives).
"""

from __future__ import annotations

from typing import Any

import torch

from polyrl.api.base import memory_bytes
from polyrl.api.resources import PolicySpec, Strategy

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


def trainer_bytes(
    n_parameters: int, trainable: int | None = None, *, ranks: int = 1, largest_layer: int = 0
) -> int:
    """Bytes a trainer rank needs before activations; `trainable` of the `n_parameters`
    train (all of them when None); sharded over `ranks` (fsdp2), with the `largest_layer`'s
    parameters gathered whole."""
    trained = n_parameters if trainable is None else trainable
    frozen = n_parameters - trained
    whole = BYTES_PER_PARAMETER * trained + BYTES_PER_FROZEN * frozen
    if ranks <= 1:
        return whole
    return -(-whole // ranks) + 8 * largest_layer  # a gathered layer's weights and gradients


def declared(policy: PolicySpec) -> int | None:
    """The trainer's declared memory (its limit, else its request), in bytes, if any."""
    resources = policy.trainer.resources
    if resources is None:
        return None
    for quantities in (resources.limits, resources.requests):
        if "memory" in quantities:
            return memory_bytes(quantities["memory"])
    return None


def shortfall(
    policy: PolicySpec,
    n_parameters: int,
    trainable: int | None = None,
    *,
    largest_layer: int = 0,
) -> str | None:
    """A warning when the trainer pod's declared memory is below the estimate; else None."""
    spec = policy.trainer
    ranks = spec.replicas * spec.nproc_per_node if spec.strategy == Strategy.FSDP2 else 1
    per_rank = trainer_bytes(n_parameters, trainable, ranks=ranks, largest_layer=largest_layer)
    have, need = declared(policy), per_rank * spec.nproc_per_node
    if have is None or have >= need:
        return None
    how = (
        "16 bytes a parameter: float32 weights, gradients and AdamW's moments"
        if trainable is None
        else f"4 bytes a frozen parameter, 16 for each of the {trainable / 1e6:.1f}M trained"
    )
    if ranks > 1:
        how += f", sharded over {ranks} ranks, plus the largest layer gathered"
    pod = f"{spec.nproc_per_node} ranks" if spec.nproc_per_node > 1 else "each trainer rank"
    return (
        f"policy {policy.name!r}: its model has {n_parameters / 1e6:.1f}M parameters, so "
        f"{pod} need{'' if spec.nproc_per_node > 1 else 's'} about {need / 2**30:.1f} GiB "
        f"({how}) before activations, but trainer.resources declares {have / 2**30:.1f} GiB "
        "of memory per pod"
    )


def decoder_layers(model: Any) -> list[Any]:
    """The model's repeated blocks: modules of the classes transformers names as never to be
    split across devices (`_no_split_modules`: `LlamaDecoderLayer`, `Qwen2DecoderLayer`, ...)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    # By any class of the module's: a sharded layer is an `FSDPLlamaDecoderLayer` subclass.
    return [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]


def layer_parameters(model: Any) -> list[int]:
    """Each decoder layer's parameter count."""
    return [sum(p.numel() for p in m.parameters()) for m in decoder_layers(model)]
