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

import ctypes
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from polyrl.workers.models import memory


def mixed_precision(device_type: str) -> MixedPrecisionPolicy:
    """bfloat16 compute with float32 reduction on accelerators; float32 throughout on CPU
    (CPUs without bfloat16 matrix units emulate it, and the CPU trainer computes in float32)."""
    if device_type == "cpu":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers (`memory.decoder_layers`), the units sharded one by one.

    Raises ValueError for a model that names none or has none of them: sharding its root alone
    would gather the whole model for every forward, which is data-parallel's memory with
    FSDP's communication."""
    layers: list[nn.Module] = memory.decoder_layers(model)
    if not layers:
        names = set(getattr(model, "_no_split_modules", None) or ())
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


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What this rank holds of `model`'s parameters, their gradients and `optimizer`'s
    per-element state (AdamW's moments), in bytes (`local_bytes`)."""
    params = list(model.parameters())
    moments = [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    return {
        "parameter_bytes": local_bytes(params),
        "gradient_bytes": local_bytes(p.grad for p in params),
        "optimizer_bytes": local_bytes(moments),
    }


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer whole, on every rank (an all-gather per tensor): for checks
    and small models; publication encodes each rank's shards instead."""
    out = {}
    for name, tensor in model.state_dict().items():
        out[name] = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return out


def resident_gb() -> float:
    """This process's resident memory now, in GiB (Linux's VmRSS; 0.0 elsewhere)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return 0.0
    kib = next((int(x.split()[1]) for x in lines if x.startswith("VmRSS:")), 0)
    return kib / 2**20


def is_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def mesh_of(world: int) -> DeviceMesh:
    """The policy's ranks as one flat mesh, on the process group torchrun made."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return init_device_mesh(device, (world,))


Opt = TypeVar("Opt", bound=torch.optim.Optimizer)


def reshard_optimizer(
    old: torch.optim.Optimizer,
    params: Iterable[nn.Parameter],
    make: Callable[[list[nn.Parameter]], Opt],
) -> Opt:
    """An optimizer over the sharded `params` (in the order `old` had them, whole) carrying
    `old`'s state, each tensor cut to this rank's shard of its parameter.

    Every rank holds `old`'s whole state here (rank 0's, broadcast), so the cut needs no
    communication beyond `distribute_tensor`'s; a fresh `old` has no state and none moves."""
    params = list(params)
    new = make(params)
    state = old.state_dict()
    for index, param in enumerate(params):
        saved = state["state"].get(index)
        if not saved:
            continue
        new.state[param] = {key: _moved(value, param) for key, value in saved.items()}
    return new


def _moved(value: Any, param: nn.Parameter) -> Any:
    """A state entry for the shard of `param`: per-element tensors (moments) cut to it,
    other tensors (Adam's step count) copied, so that nothing is shared with `old`."""
    if not isinstance(value, torch.Tensor):
        return value
    if tuple(value.shape) == tuple(param.shape):
        return _shard_like(value, param)
    return value.clone()


def _shard_like(value: torch.Tensor, param: nn.Parameter) -> torch.Tensor:
    assert isinstance(param, DTensor)
    return distribute_tensor(value.to(param.dtype), param.device_mesh, param.placements)


def release_freed_memory() -> None:
    """Hand the whole model's freed pages back to the system (glibc's `malloc_trim`): each
    rank built the model whole before sharding it, and without this its resident memory
    would stay at the whole model's however little it now holds. Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.malloc_trim(0)
