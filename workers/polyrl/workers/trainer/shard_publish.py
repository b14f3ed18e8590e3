"""A sharded trainer's weight versions, published from its shards: no rank gathers the model.

Each rank keeps the bf16 copy of its own rows of every weight as last published (1/N of the
model's bf16 bytes) and encodes its part of each version against it: a keyframe when one is
due, and a delta from the previous version (`weightsync.pieces` says how replicas put the
parts together). Rank 0 alone talks to NATS: for each object it writes its own part, then
receives each other rank's part in turn and writes it before receiving the next, so a rank
holds at most its own parts and, on rank 0, one other rank's; then it announces the object
once, in parts (`Leader`).

Every rank encodes at once, each over 1/N of the weights, on the step's path: the ranks wait
for rank 0's writes before the next step. The data-parallel trainer encodes off it, on rank 0
alone, the whole model. The parts travel over a gloo group of their own, so the transfer
works beside NCCL on accelerators and never interleaves with the training collectives.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from polyrl.api.resources import PolicySpec, WeightSync
from polyrl.workers.deltas.encoders import Snapshot
from polyrl.workers.deltas.encoders.inline import InlineEncoder
from polyrl.workers.deltas.format import Blob
from polyrl.workers.weightsync import chain
from polyrl.workers.weightsync.announce import ObjectKind


def keyframe_every(policy: PolicySpec) -> int:
    """Versions between keyframes: every one under `weightSync: full`."""
    return 1 if policy.weight_sync == WeightSync.FULL else policy.keyframe_every


@dataclasses.dataclass(frozen=True, slots=True)
class Part:
    """This rank's part of one object of a version."""

    name: str  # the object's name (`chain`), the same on every rank
    kind: ObjectKind
    base: int | None  # the delta's base version; None for a keyframe
    blob: bytes


def local_rows(model: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """This rank's rows of every weight in bf16: a sharded parameter's local shard (rows it
    has none of are left out), and what is not sharded (buffers) on rank 0 only."""
    out = {}
    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor):
            if tuple(tensor.placements) != (Shard(0),):
                raise ValueError(f"{name} is placed {tensor.placements}, not sharded by rows")
            local = tensor.to_local()
            if local.numel():
                out[name] = local.detach().to(torch.bfloat16).contiguous()
        elif rank == 0:
            out[name] = tensor.detach().to(torch.bfloat16).contiguous()
    return out


class ShardParts:
    """One rank's side of publication: its last published rows and the parts it encodes."""

    def __init__(self, *, keyframe_every: int, group: dist.ProcessGroup | None = None) -> None:
        chain.is_keyframe_version(0, keyframe_every)  # validates
        self.keyframe_every = keyframe_every
        self.encoder = InlineEncoder()
        self.published: Snapshot | None = None
        self.version: int | None = None
        self.group = group  # the ranks' gloo group the parts travel over (`for_ranks`)

    @classmethod
    def for_ranks(cls, *, keyframe_every: int) -> ShardParts:
        """Made on every rank at once (`dist.new_group` is collective)."""
        return cls(keyframe_every=keyframe_every, group=dist.new_group(backend="gloo"))

    def encode(self, rows: dict[str, torch.Tensor], version: int) -> list[Part]:
        """This rank's parts of `version`, whose rows of the weights are `rows`
        (`local_rows`, in bf16, fresh copies: kept as the next delta's base): its keyframe
        part when one is due (always the first), then its delta part from the last version."""
        if self.version is not None and version <= self.version:
            raise ValueError(f"version {version} is not after {self.version}")
        snapshot = {name: t.cpu() for name, t in rows.items()}
        parts = []
        if self.published is None or chain.is_keyframe_version(version, self.keyframe_every):
            blob = self.encoder.keyframe(snapshot, version=version)
            parts.append(Part(chain.keyframe_name(version), ObjectKind.KEYFRAME, None, blob))
        if self.published is not None and self.version is not None:
            blob = self.encoder.delta(
                self.published, snapshot, base_version=self.version, new_version=version
            )
            name = chain.delta_name(self.version, version)
            parts.append(Part(name, ObjectKind.DELTA, self.version, blob))
        self.published, self.version = snapshot, version
        return parts

    def send(self, parts: list[Part]) -> None:
        """Ranks other than 0: hand each part to rank 0, which writes it (`receive`)."""
        for part in parts:
            size = torch.tensor([len(part.blob)], dtype=torch.int64)
            dist.send(size, dst=0, group=self.group)
            with warnings.catch_warnings():  # read-only bytes, only ever read by the send
                warnings.simplefilter("ignore", UserWarning)
                data = torch.frombuffer(part.blob, dtype=torch.uint8)
            dist.send(data, dst=0, group=self.group)

    def receive(self, rank: int) -> Blob:
        """Rank 0: the next part `rank` sends, as its bytes."""
        size = torch.empty(1, dtype=torch.int64)
        dist.recv(size, src=rank, group=self.group)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(data, src=rank, group=self.group)
        return memoryview(data.numpy().data).cast("B")
