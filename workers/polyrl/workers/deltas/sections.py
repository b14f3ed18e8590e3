"""How changed elements and whole tensors are laid out in the payload, and zstd around it.

The changed elements of all "sparse" tensors share four streams, each the concatenation, in header
order, of every sparse tensor's part (`count` = its changed elements, k = its element size)::

    0  gap symbols     count bytes: min(gap, 255), gap = position - previous position - 1, the
                       first previous position being -1
    1  value symbols   ceil(count / 2) bytes: 4-bit min(z, 15), low nibble first, where z is the
                       zigzagged ordered difference of `bitviews.value_delta`
    2  gap escapes     byte planes (u64) of gap - 255 for every gap symbol that is 255
    3  value escapes   byte planes (u64) of z - 15 for every value symbol that is 15

A decoder reads the symbol streams first, counts the escape symbols in each tensor's part and so
knows where every part of streams 2 and 3 begins: no per-tensor lengths are stored. Sharing the
streams across tensors, rather than one frame per tensor, saves zstd's per-frame header and Huffman
tables, which on a small model cost more than the data (1.58 against 1.19 bytes per changed element
on a 0.9 M-parameter Llama); on a large model it changes nothing, and the streams stay homogeneous.

A "whole" tensor has a section of its own after the four streams: the k byte planes of its new bits.

Every stream and section is a zstd frame, or the bytes as they are when zstd would not make them
smaller: `length == raw_length` in the header says which, so a tiny or incompressible tensor never
costs more than itself. Gaps are coded relative to positions, never stored as 4-byte indices (COO):
at 1% density a gap is about 100 and takes one entropy-coded byte.

zstd level: measured on bf16 training deltas, the levels differ by about 1% in size (the streams
are literals, there is little to match) and level 1 is the smallest as well as the fastest (1.219
bytes per changed element, level 3 1.233, level 9 1.235). Keyframes too: level 1 stores bf16 in
0.689 of its size at 200 MB/s a core, level 3 0.711, level 9 0.701 at a fifth of the speed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import zstandard

from polyrl.workers.deltas import errors, packing
from polyrl.workers.deltas.bitviews import UInt, unsigned_type, value_delta
from polyrl.workers.deltas.diff import Changes, Positions

DEFAULT_LEVEL = 1
GAP_BITS = 8
VALUE_BITS = 4
_GAP_ESCAPE = (1 << GAP_BITS) - 1
_VALUE_ESCAPE = (1 << VALUE_BITS) - 1

U64 = npt.NDArray[np.uint64]


@dataclasses.dataclass(slots=True)
class SparsePart:
    """One tensor's share of the four sparse streams."""

    gap_symbols: packing.Bytes
    value_symbols: packing.Bytes
    gap_escapes: U64
    value_escapes: U64

    def raw_size(self) -> int:
        symbols = len(self.gap_symbols) + len(self.value_symbols)
        return symbols + 8 * (len(self.gap_escapes) + len(self.value_escapes))


def sparse_part(changes: Changes, floating: bool) -> SparsePart:
    gaps = np.diff(changes.positions, prepend=-1).astype(np.uint64) - np.uint64(1)
    gap_symbols, gap_escapes = packing.to_symbols(gaps, GAP_BITS)
    folded = value_delta(changes.old, changes.new, floating).astype(np.uint64)
    value_symbols, value_escapes = packing.to_symbols(folded, VALUE_BITS)
    return SparsePart(gap_symbols, value_symbols, gap_escapes, value_escapes)


def sparse_parts(olds: Sequence[UInt], news: Sequence[UInt], floating: bool) -> list[SparsePart]:
    """`sparse_part` of every (old, new) pair at once, for many small tensors of one dtype kind.

    The same bytes as one `sparse_part` per tensor, from a dozen numpy calls in all: the pairs
    are diffed as one array, gaps restart at -1 at each tensor's first change, and every
    tensor's value symbols start on a byte of their own (a pad nibble after an odd count).
    """
    sizes = np.array([len(new) for new in news], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    old, new = np.concatenate(olds), np.concatenate(news)
    positions = np.flatnonzero(old != new)
    firsts = np.searchsorted(positions, starts)  # where each tensor's changes begin
    counts = np.diff(firsts, append=len(positions))
    owner = np.repeat(np.arange(len(news)), counts)
    local = positions - starts[owner]
    previous = np.empty_like(local)
    previous[1:] = local[:-1]
    previous[firsts[counts > 0]] = -1
    gaps = (local - previous - 1).astype(np.uint64)
    gap_symbols, gap_escapes = packing.to_symbols(gaps, GAP_BITS)
    folded = value_delta(old[positions], new[positions], floating).astype(np.uint64)
    symbols, value_escapes = packing.capped(folded, VALUE_BITS)
    # Each tensor's symbols from an even index, so each packs into bytes of its own.
    lengths = -(-counts // 2)
    aligned = np.zeros(2 * int(lengths.sum()), dtype=np.uint8)
    aligned[np.arange(len(symbols)) + (np.cumsum(counts % 2) - counts % 2)[owner]] = symbols
    escaped_gaps = np.bincount(owner[gap_symbols == _GAP_ESCAPE], minlength=len(news))
    escaped_values = np.bincount(owner[symbols == _VALUE_ESCAPE], minlength=len(news))
    split = [
        np.split(values, np.cumsum(per_tensor)[:-1])
        for values, per_tensor in (
            (gap_symbols, counts),
            (packing.pack_nibbles(aligned), lengths),
            (gap_escapes, escaped_gaps),
            (value_escapes, escaped_values),
        )
    ]
    return [SparsePart(*fields) for fields in zip(*split, strict=True)]


def join_streams(parts: Sequence[SparsePart]) -> list[bytes]:
    """The four raw streams holding `parts`, in order."""

    def joined(field: str) -> npt.NDArray[np.unsignedinteger]:
        arrays = [getattr(part, field) for part in parts]
        return np.concatenate(arrays) if arrays else np.empty(0, dtype=np.uint8)

    return [
        joined("gap_symbols").tobytes(),
        joined("value_symbols").tobytes(),
        packing.split_planes(joined("gap_escapes").astype(np.uint64)).tobytes(),
        packing.split_planes(joined("value_escapes").astype(np.uint64)).tobytes(),
    ]


def split_streams(
    raws: Sequence[bytes], counts: Sequence[int], numels: Sequence[int]
) -> list[tuple[Positions, U64]]:
    """Positions and zigzagged value deltas of each sparse tensor, given its count and numel."""
    if not counts:
        if any(raws):
            raise errors.CorruptDelta("sparse streams present without sparse tensors")
        return []
    gap_symbols, value_symbols = _symbols(raws[0], raws[1], counts)
    gap_escapes = _escapes(raws[2], gap_symbols, _GAP_ESCAPE)
    value_escapes = _escapes(raws[3], value_symbols, _VALUE_ESCAPE)
    return [
        (
            _positions(packing.with_escapes(gaps, gap_rest, GAP_BITS), numel),
            packing.with_escapes(values, value_rest, VALUE_BITS),
        )
        for gaps, gap_rest, values, value_rest, numel in zip(
            gap_symbols, gap_escapes, value_symbols, value_escapes, numels, strict=True
        )
    ]


def _symbols(
    gap_raw: bytes, value_raw: bytes, counts: Sequence[int]
) -> tuple[list[packing.Bytes], list[packing.Bytes]]:
    """Each tensor's gap symbols and value symbols, one per byte."""
    gap_stream = np.frombuffer(gap_raw, dtype=np.uint8)
    value_stream = np.frombuffer(value_raw, dtype=np.uint8)
    value_lengths = [packing.symbols_length(count, VALUE_BITS) for count in counts]
    if len(gap_stream) != sum(counts) or len(value_stream) != sum(value_lengths):
        raise errors.CorruptDelta("symbol streams do not match the changed-element counts")
    values = np.split(value_stream, np.cumsum(value_lengths)[:-1])
    return (
        np.split(gap_stream, np.cumsum(counts)[:-1]),
        [packing.from_symbols(v, n, VALUE_BITS) for v, n in zip(values, counts, strict=True)],
    )


def _positions(gaps: U64, numel: int) -> Positions:
    if int(gaps.max()) >= numel:
        raise errors.CorruptDelta("gap beyond the end of the tensor")
    positions = np.cumsum(gaps.astype(np.int64) + 1) - 1
    if positions[-1] >= numel:
        raise errors.CorruptDelta("changed position beyond the end of the tensor")
    return positions


def _escapes(raw: bytes, symbols: Sequence[packing.Bytes], escape: int) -> list[U64]:
    """Each tensor's escape remainders, from the stream and the escape symbols in `symbols`."""
    per_tensor = [int(np.count_nonzero(part == escape)) for part in symbols]
    if len(raw) != 8 * sum(per_tensor):
        raise errors.CorruptDelta("escape stream does not match the escape symbols")
    remainders: U64 = packing.join_planes(np.frombuffer(raw, dtype=np.uint8), np.uint64)
    return np.split(remainders, np.cumsum(per_tensor)[:-1])


def build_whole(new: UInt) -> bytes:
    return packing.split_planes(new).tobytes()


def parse_whole(raw: bytes, numel: int, itemsize: int) -> UInt:
    if len(raw) != numel * itemsize:
        raise errors.CorruptDelta(f"whole section of {len(raw)} bytes for {numel} elements")
    return packing.join_planes(np.frombuffer(raw, dtype=np.uint8), unsigned_type(itemsize))


def compress(raw: bytes, level: int) -> bytes:
    """A zstd frame of `raw`, or `raw` itself when that is not larger."""
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=False)
    packed = compressor.compress(raw) if raw else raw
    return packed if len(packed) < len(raw) else raw


def decompress(section: memoryview, raw_length: int) -> bytes:
    if len(section) == raw_length:
        return bytes(section)
    try:
        raw = zstandard.ZstdDecompressor().decompress(section, max_output_size=raw_length)
    except zstandard.ZstdError as exc:
        raise errors.CorruptDelta(f"section does not decompress: {exc}") from exc
    if len(raw) != raw_length:
        raise errors.CorruptDelta(f"section decompressed to {len(raw)}, not {raw_length} bytes")
    return raw
