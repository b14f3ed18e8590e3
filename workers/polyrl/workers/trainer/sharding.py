"""FSDP2: a model's decoder layers and its root sharded over the policy's ranks.

Data-parallel ranks each hold the whole model, its gradients and its Adam state, about 16
bytes a parameter; sharded, each holds 1/N of them and gathers one layer's weights at a time
for its forward and backward (`torch.distributed.fsdp.fully_shard`). Each decoder layer is its
own unit, so a rank's peak holds its shards plus about one whole layer; the root unit holds
what lies outside the layers (embeddings, final norm, a tied or untied head), gathered for the
first and last computations of a step.

On accelerators the layers compute in bfloat16 while the sharded master weights, the gradient
reduction and the optimizer stay in float32 (`mixed_precision`); on CPU everything is float32,
as the data-parallel trainer computes there, so the two agree to rounding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def mixed_precision(device_type: str) -> MixedPrecisionPolicy:
    """bfloat16 compute with float32 reduction on accelerators; float32 throughout on CPU
    (CPUs without bfloat16 matrix units emulate it, and the CPU trainer computes in float32)."""
    if device_type == "cpu":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: modules of the classes transformers names as never to be
    split across devices (`_no_split_modules`: `LlamaDecoderLayer`, `Qwen2DecoderLayer`, ...).

    Raises ValueError for a model that names none or has none of them: sharding its root alone
    would gather the whole model for every forward, which is data-parallel's memory with
    FSDP's communication."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        kind = type(model).__name__
        raise ValueError(
            f"{kind} names no decoder-layer class to shard by (transformers' _no_split_modules: "
            f"{sorted(names) or 'none'}); trainer.strategy fsdp2 needs one"
        )
    return layers


def shard(model: nn.Module, mesh: DeviceMesh, *, precision: MixedPrecisionPolicy) -> nn.Module:
    """Shard `model` in place over `mesh`: each decoder layer, then the root. Its parameters
    become DTensors (`to_local()` is this rank's shard); forward and backward gather and
    reduce-scatter as they go, so an optimizer built on `model.parameters()` afterwards steps
    this rank's shards only."""
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=precision)
    fully_shard(model, mesh=mesh, mp_policy=precision)
    return model


def local_bytes(tensors: Any) -> int:
    """Bytes this rank holds of `tensors` (parameters, gradients or optimizer state): a
    DTensor's local shard, a plain tensor whole."""
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer whole, on every rank (an all-gather per tensor): for checks
    and small models; publication encodes each rank's shards instead."""
    out = {}
    for name, tensor in model.state_dict().items():
        out[name] = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return out
