"""The trainer's ranks under torchrun: process group, and rank 0's orders to the others.

Rank 0 alone talks to NATS; it tells every other rank what to do next (`order`): a step on
the samples it hands them, and, once the model is sharded (`trainer.strategy: fsdp2`), each
version to publish (every rank encodes its rows, `shard_publish`) and each checkpoint (every
rank writes its shards), then stop. The
other ranks only follow (`follow`), so every rank meets every collective in the same order.
"""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist
import xxhash

from polyrl.workers.trainer import batching, shard_publish, sharding


class Order(enum.StrEnum):
    """What rank 0 tells the other ranks to do next."""

    PREPARE = "prepare"  # sharded: the warm-up and the evaluation's preparation, together
    STEP = "step"  # a training step on the samples sent with it
    PUBLISH = "publish"  # encode this rank's part of the version sent with it
    SAVE = "save"  # write this rank's shards of a checkpoint
    STOP = "stop"  # training is over


class Follower(Protocol):
    """What a rank other than 0 runs on rank 0's orders (`learner.Learner`)."""

    def step(self, samples: list[batching.Sample]) -> dict[str, float]: ...
    def publish_part(self, version: int) -> list[shard_publish.Part]: ...
    def save(self) -> None: ...
    def saved(self) -> None: ...


def order(kind: Order, payload: list[batching.Sample] | int | None = None) -> None:
    """Rank 0: tell every other rank what comes next (with a step's samples, or the version
    to publish)."""
    dist.broadcast_object_list([str(kind), payload], src=0)


def _receive() -> tuple[Order, Any]:
    box: list[Any] = [None, None]
    dist.broadcast_object_list(box, src=0)
    return Order(box[0]), box[1]


def follow(learner: Follower, prepare: Callable[[], None] | None = None) -> None:
    """Ranks other than 0: do what rank 0 orders, until it says stop (`prepare`: what a
    sharded trainer's ranks run together before RL, `before_rl.follow`)."""
    while True:
        kind, payload = _receive()
        if kind == Order.STOP:
            learner.saved()  # a checkpoint still written in the background lands first
            return
        if kind == Order.PREPARE:
            if prepare is None:
                raise RuntimeError("rank 0 ordered the phases before RL; this rank has none")
            prepare()
        elif kind == Order.STEP:
            learner.step(payload or [])
        elif kind == Order.PUBLISH:
            learner.publish_part(payload)  # encoded and handed to rank 0, which writes it
        elif kind == Order.SAVE:
            learner.save()


def fingerprint(model: torch.nn.Module) -> str:
    """A hash of every weight's bits: equal on every rank that took the same steps (a
    sharded model's whole weights: every rank gathers them)."""
    digest = xxhash.xxh3_64()
    for name, tensor in sorted(sharding.full_state(model).items()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().reshape(-1).contiguous()
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def agree(step: int, model: torch.nn.Module) -> str:
    """Every rank, once training ends: the ranks compare their step and weights (one
    all-gather); a summary, or RanksDiverged where they differ, which would mean a rank
    trained on other samples or missed an update."""
    mine = (step, fingerprint(model))
    seen: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, mine)
    if any(tuple(other) != mine for other in seen):
        raise RanksDiverged(f"ranks ended apart: (step, weights) per rank {seen}")
    return f"{len(seen)} ranks agree: step {step}, weights {mine[1]}"


class RanksDiverged(RuntimeError):
    """Data-parallel ranks ended with different steps or weights."""


def init_process_group() -> None:
    """gloo on CPU, nccl on GPU; a lone process (no torchrun) is a world of one."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
