"""Which elements changed, bit for bit, and the checksum of the new tensor, in one pass.

The trainer diffs the whole model every step, so this is the hot loop of encoding, and it is bound
by memory bandwidth. Three choices keep it near a `copy_`:

- Compare 64-bit words, four bf16 elements at a time, and split only the few words that differ
  back into elements: numpy writes and scans a quarter of the bools an element-wise compare would.
- Work in chunks of 2 MiB per input, and do everything for a chunk (compare, gather the changed
  words, split them, feed the new bytes to the streaming xxh3) while it is in cache, so each input
  is read from memory once. Gathering changed words from the whole tensor afterwards costs a cache
  miss per changed element, and hashing separately a third pass over memory.
- Measured on 256 MiB of bf16 with 1% of elements changed, single-threaded, against 38 ms for a
  `copy_`: element-wise compare, then gather, then hash 160 ms or more; this 110 ms.

The inputs are the unsigned-integer views of `bitviews.bits`, so +0.0 vs -0.0 and NaN payloads
count as changes exactly when their bits differ.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import xxhash

from polyrl.workers.deltas.bitviews import UInt

Positions = npt.NDArray[np.int64]

# 2 MiB per input. Measured encoding 512 MiB of bf16 (1 % changed, 2 threads, 1 MiB L2 and 32 MiB
# L3), best of 5, three rounds: 256 KiB 308 ms, 1 MiB 158-195 ms, 2 MiB 152-162 ms, 4 MiB
# 162-169 ms. Smaller chunks pay numpy's per-call cost, holding the GIL, too often.
CHUNK_WORDS = 1 << 18


@dataclasses.dataclass(slots=True, frozen=True)
class Changes:
    positions: Positions  # ascending
    old: UInt  # the bits at `positions` before
    new: UInt  # and after
    checksum: int  # xxh3_64 of the whole new tensor's bytes


def scan(old: UInt, new: UInt) -> Changes:
    """The elements whose bits differ, with their old and new bits, and the new checksum."""
    if old.shape != new.shape or old.dtype != new.dtype or old.ndim != 1:
        raise ValueError(f"cannot diff {old.dtype}{old.shape} with {new.dtype}{new.shape}")
    per_word = 8 // old.dtype.itemsize
    shift = per_word.bit_length() - 1
    aligned = len(old) - len(old) % per_word
    old_words, new_words = old[:aligned].view(np.uint64), new[:aligned].view(np.uint64)
    hasher = xxhash.xxh3_64()
    found: list[tuple[Positions, UInt, UInt]] = []
    for start in range(0, len(old_words), CHUNK_WORDS):
        old_chunk = old_words[start : start + CHUNK_WORDS]
        new_chunk = new_words[start : start + CHUNK_WORDS]
        hasher.update(new_chunk.data)
        words = np.flatnonzero(old_chunk != new_chunk)
        old_lanes = old_chunk[words].view(old.dtype)
        new_lanes = new_chunk[words].view(old.dtype)
        lanes = np.flatnonzero(old_lanes != new_lanes)
        positions = ((words[lanes >> shift] + start) << shift) | (lanes & (per_word - 1))
        found.append((positions, old_lanes[lanes], new_lanes[lanes]))
    hasher.update(new[aligned:].data)
    tail = np.flatnonzero(old[aligned:] != new[aligned:])
    found.append((tail + aligned, old[aligned:][tail], new[aligned:][tail]))
    return Changes(
        positions=np.concatenate([positions for positions, _, _ in found]),
        old=np.concatenate([values for _, values, _ in found]),
        new=np.concatenate([values for _, _, values in found]),
        checksum=hasher.intdigest(),
    )
