"""Weight objects in parts, one per rank of a sharded trainer, put back together by replicas.

A rank of an FSDP2 trainer holds rows [start, stop) of each parameter's first dimension
(`fully_shard` shards dim 0, in rank order) and whole copies of what is not sharded. It
encodes its part of each version with the ordinary codec over those rows, so no rank ever
gathers the whole model to publish it (`chain.part_name` names the parts). A tensor is the
concatenation, along dim 0 and in part order, of its rows in the parts that carry it; a
tensor carried whole by one part (a buffer, a scalar) is that part's.

A replica applies each part to views of its whole tensors (rows of a contiguous tensor are
contiguous), so nothing is copied and the codec checks every row range against the trainer's
checksum as it does for whole objects. The result is bit for bit what a data-parallel trainer
publishes for the same weights: the same bf16 values, in the same tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from polyrl.workers.deltas import bitviews, decode, errors, format
from polyrl.workers.deltas.format import Header

State = dict[str, torch.Tensor]


@dataclasses.dataclass(slots=True)
class Placed:
    """One tensor of an object in parts: its whole shape and where each part's rows go."""

    dtype: str
    shape: tuple[int, ...]
    rows: list[tuple[int, int, int]]  # (part, first row, rows) for each part that carries it


def layout(headers: Sequence[Header]) -> dict[str, Placed]:
    """Every tensor of the parts' `headers`, in order of first appearance, with its whole
    shape; `CorruptDelta` where the parts disagree (versions, dtypes, trailing dimensions, a
    scalar in two parts): parts of different objects."""
    versions = {(h.base_version, h.new_version) for h in headers}
    if len(versions) != 1:
        raise errors.CorruptDelta(f"parts of one object hold different versions: {versions}")
    placed: dict[str, Placed] = {}
    for part, header in enumerate(headers):
        for entry in header.tensors:
            known = placed.get(entry.name)
            if known is None:
                rows = entry.shape[0] if entry.shape else 1
                placed[entry.name] = Placed(entry.dtype, entry.shape, [(part, 0, rows)])
                continue
            scalar = not entry.shape or not known.shape
            if scalar or known.dtype != entry.dtype or known.shape[1:] != entry.shape[1:]:
                raise errors.CorruptDelta(
                    f"{entry.name}: part {part} has {entry.dtype}{list(entry.shape)}, "
                    f"earlier parts {known.dtype}{list(known.shape)}"
                )
            known.rows.append((part, known.shape[0], entry.shape[0]))
            known.shape = (known.shape[0] + entry.shape[0], *known.shape[1:])
    return placed


def prepare(
    state: State | None, blobs: Sequence[format.Blob], *, have_version: int | None
) -> tuple[Header, State, list[State]]:
    """Check an object's parts (every container, their layout, the base version) before
    any is applied: the object's header (its tensors every part's), the state they apply to
    (a new one, for a keyframe, when `state` is None) and each part's views of it.
    Raises `DeltaError`s, leaving `state` untouched."""
    headers = [format.read_header(blob) for blob in blobs]  # checks every container
    placed = layout(headers)
    first = headers[0]
    if not first.is_keyframe and (state is None or first.base_version != have_version):
        raise errors.BaseVersionMismatch(
            f"delta {first.base_version} -> {first.new_version} on version {have_version}"
        )
    state = empty_state(placed) if state is None else state
    header = dataclasses.replace(first, tensors=tuple(e for h in headers for e in h.tensors))
    return header, state, views(state, placed, len(blobs))


def apply(
    blobs: Sequence[format.Blob],
    targets: list[State],
    *,
    have_version: int | None,
    workers: int | None = None,
) -> None:
    """Apply each part to its views (`prepare`). Each part is all or nothing, the object is
    not: after a `DeltaError` the state may hold some parts' new rows beside old ones, so its
    version is unknown until a keyframe is applied."""
    for blob, target in zip(blobs, targets, strict=True):
        decode.apply_delta(target, blob, have_version=have_version, workers=workers)


def empty_state(placed: dict[str, Placed]) -> State:
    """Whole tensors, uninitialised, for a replica that loads its first keyframe in parts."""
    return {
        name: torch.empty(p.shape, dtype=bitviews.torch_dtype(p.dtype))
        for name, p in placed.items()
    }


def views(state: State, placed: dict[str, Placed], parts: int) -> list[State]:
    """For each part, the rows of `state`'s tensors it rewrites (views, no copies);
    `TargetMismatch` where `state` lacks a tensor or holds it in another shape or dtype."""
    missing, extra = sorted(set(placed) - set(state)), sorted(set(state) - set(placed))
    if missing or extra:
        raise errors.TargetMismatch(f"target lacks {missing[:5]}, has extra {extra[:5]}")
    out: list[State] = [{} for _ in range(parts)]
    for name, p in placed.items():
        tensor = state[name]
        if tuple(tensor.shape) != p.shape or bitviews.dtype_name(tensor.dtype) != p.dtype:
            raise errors.TargetMismatch(
                f"{name}: the parts make {p.dtype}{list(p.shape)}, "
                f"target {tensor.dtype}{list(tensor.shape)}"
            )
        for part, first, rows in p.rows:
            out[part][name] = tensor.narrow(0, first, rows) if tensor.dim() else tensor
    return out
