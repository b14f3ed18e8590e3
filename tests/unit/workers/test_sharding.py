"""FSDP2 sharding (`trainer.sharding`): which modules become units, the precision policy by
device, and a sharded model that takes the plain model's steps in a world of one rank (gloo).
Several ranks against the data-parallel trainer are the integration tests' job."""

from __future__ import annotations

import copy
import os
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import LlamaForCausalLM

from polyrl.workers.models.loading import tiny_llama_config
from polyrl.workers.trainer import sharding


@pytest.fixture
def mesh() -> Iterator[DeviceMesh]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()
        assert "RANK" not in os.environ  # the test set no torchrun variables


def model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(64, layers=3))  # type: ignore[no-untyped-call]


def test_the_units_are_the_decoder_layers_and_a_model_without_them_is_refused() -> None:
    layers = sharding.decoder_layers(model())
    assert [type(m).__name__ for m in layers] == ["LlamaDecoderLayer"] * 3
    with pytest.raises(ValueError, match="names no decoder-layer class"):
        sharding.decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_accelerators_compute_in_bfloat16_and_reduce_in_float32_while_cpus_stay_float32() -> None:
    cuda = sharding.mixed_precision("cuda")
    assert (cuda.param_dtype, cuda.reduce_dtype) == (torch.bfloat16, torch.float32)
    cpu = sharding.mixed_precision("cpu")
    assert (cpu.param_dtype, cpu.reduce_dtype) == (None, None)


@pytest.mark.slow  # a process group and three optimizer steps of two models: a few seconds
def test_a_sharded_model_takes_the_plain_models_steps(mesh: DeviceMesh) -> None:
    plain = model()
    sharded = sharding.shard(copy.deepcopy(plain), mesh, precision=sharding.mixed_precision("cpu"))
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    ids = torch.randint(3, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    for net in (plain, sharded):
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
        for _ in range(3):
            optimizer.zero_grad()
            net(input_ids=ids, labels=ids).loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            optimizer.step()
    whole = sharding.full_state(sharded)
    moved = max((t - model().state_dict()[n]).abs().max().item() for n, t in whole.items())
    assert moved > 1e-3  # the steps changed the weights
    for name, tensor in plain.state_dict().items():
        assert torch.allclose(tensor, whole[name], atol=1e-6), name
    params = list(sharded.parameters())
    assert sharding.local_bytes(params) == sum(p.numel() * 4 for p in plain.parameters())


def adam_steps(net: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    ids = torch.randint(3, 64, (4, 12), generator=torch.Generator().manual_seed(2))
    for _ in range(steps):
        optimizer.zero_grad()
        net(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()


@pytest.mark.slow  # a process group and a few optimizer steps of two models: a few seconds
def test_an_optimizer_moved_onto_the_shards_keeps_its_state(
    mesh: DeviceMesh,
) -> None:
    """What a trainer resumed from a data-parallel checkpoint does when it shards: the plain
    optimizer's moments go with the weights, so the next steps are the unsharded trainer's."""
    plain = model()
    before = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    adam_steps(plain, before, 2)
    twin = copy.deepcopy(plain)
    twin_optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    twin_optimizer.load_state_dict(before.state_dict())
    sharding.shard(twin, mesh, precision=sharding.mixed_precision("cpu"))
    moved = sharding.reshard_optimizer(
        twin_optimizer, twin.parameters(), lambda ps: torch.optim.AdamW(ps, lr=1e-2)
    )
    assert all(isinstance(s["exp_avg"], DTensor) for s in moved.state.values())
    adam_steps(plain, before, 2)
    adam_steps(twin, moved, 2)
    whole = sharding.full_state(twin)
    for name, tensor in plain.state_dict().items():
        assert torch.allclose(tensor, whole[name], atol=1e-6), name
    expected = before.state_dict()["state"]
    for index, param in enumerate(twin.parameters()):  # the moments, gathered whole
        for key in ("exp_avg", "exp_avg_sq"):
            whole_moment = moved.state[param][key].full_tensor()
            assert torch.allclose(whole_moment, expected[index][key], atol=1e-6), (index, key)
