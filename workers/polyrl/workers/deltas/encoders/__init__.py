"""Where the trainer's delta encoding runs: in a thread of the trainer, or in a process of its own.

The publisher hands an `Encoder` its state after every step and asks for a keyframe or a delta;
the encoder owns the snapshots those are made from, so each implementation keeps them where it
can read them fast: `inline.InlineEncoder` in the trainer's memory, encoding on the calling thread
(the publisher calls it through `asyncio.to_thread`); `process.ProcessEncoder` in shared memory,
encoding in a child process.

Why a process: the codec's loops run in numpy, zstd and xxhash, which release the GIL, but the
glue between them is Python, and a thread of the trainer holds the GIL while running it. The
training step beside it is Python too (a model's forward and backward are thousands of small op
dispatches), so the two take turns. Measured on the tiny Llama with one training thread on 2
cores (docs/benchmarks.md): a 9 ms encode on a thread slowed the 70-85 ms step beside it by
5.3-5.8 %; in a process of its own, which shares only the cores, by -2.5 to +1 %.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

StateDict = Mapping[str, torch.Tensor]
Snapshot = dict[str, torch.Tensor]


class Encoder(Protocol):
    """Snapshots of published states, and the keyframes and deltas made from them."""

    def snapshot(self, state: StateDict, *, keep: Snapshot | None) -> Snapshot:
        """A copy of `state` on the CPU that this encoder can encode; `keep` stays untouched.

        `keep` is the last published snapshot (the next delta's base); an encoder may reuse the
        memory of any older snapshot it gave out.
        """

    def keyframe(self, state: Snapshot, *, version: int) -> bytes:
        """`encode.encode_keyframe` of one of this encoder's snapshots."""

    def delta(self, old: Snapshot, new: Snapshot, *, base_version: int, new_version: int) -> bytes:
        """`encode.encode_delta` between two of this encoder's snapshots."""

    def close(self) -> None:
        """Release what the encoder holds (a process, shared memory); idempotent."""
