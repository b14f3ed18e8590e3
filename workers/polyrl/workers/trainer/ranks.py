"""Data-parallel ranks of the trainer under torchrun: process group, batch sharing.

Rank 0 alone talks to NATS; it hands each step's samples to every rank and, at the end,
None to say stop. Every other rank only follows (`follow`), training on its shard.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import xxhash

from polyrl.workers.trainer import batching


def share_batch(samples: list[batching.Sample] | None) -> list[batching.Sample] | None:
    """Rank 0 hands the step's samples to every rank (None: training is over)."""
    box: list[Any] = [samples]
    dist.broadcast_object_list(box, src=0)
    result: list[batching.Sample] | None = box[0]
    return result


def follow(step: Callable[[list[batching.Sample]], Any]) -> None:
    """Ranks other than 0: take a `step` on each batch rank 0 shares until it says stop."""
    while (samples := share_batch(None)) is not None:
        step(samples)


def fingerprint(model: torch.nn.Module) -> str:
    """A hash of every weight's bits: equal on every rank that took the same steps."""
    digest = xxhash.xxh3_64()
    for name, tensor in sorted(model.state_dict().items()):
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
