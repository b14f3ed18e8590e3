"""The encoder that runs the codec on the calling thread, on snapshots in the caller's memory."""

from __future__ import annotations

from polyrl.workers.deltas import encode
from polyrl.workers.deltas.encoders import Snapshot, StateDict


class InlineEncoder:
    """`encode`'s functions as an `Encoder`; `workers` is their thread count (None: default)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def snapshot(self, state: StateDict, *, keep: Snapshot | None) -> Snapshot:
        return {name: t.detach().to("cpu").contiguous().clone() for name, t in state.items()}

    def keyframe(self, state: Snapshot, *, version: int) -> bytes:
        return encode.encode_keyframe(state, version=version, workers=self.workers)

    def delta(self, old: Snapshot, new: Snapshot, *, base_version: int, new_version: int) -> bytes:
        return encode.encode_delta(
            old, new, base_version=base_version, new_version=new_version, workers=self.workers
        )

    def close(self) -> None:
        pass
