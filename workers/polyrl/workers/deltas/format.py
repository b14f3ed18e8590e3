"""The container that carries a weight delta or a keyframe, byte by byte.

One format for both, so a rollout worker has one reader and one verification path: a keyframe is
simply an object with no base version whose tensors are all sent whole. All integers are
little-endian; the codec refuses to load on a big-endian host, where the byte planes and the
checksums (taken over the tensors' native bytes) would mean something else.

Prelude, 32 bytes::

    offset  size  field
    0       4     magic b"PLRD" (PolyRL Delta)
    4       2     u16 encoder version (ENCODER_VERSION); a decoder refuses any other
    6       2     u16 flags, 0; reserved, a decoder refuses any other value
    8       4     u32 H: length of the compressed header
    12      4     u32 J: length of the header once decompressed
    16      8     u64 P: length of the payload
    24      8     u64 xxh3_64 over bytes [0, 24) then [32, 32 + H + P): everything but itself
    32      H     header: a zstd frame of UTF-8 JSON, J bytes (schema below)
    32 + H  P     payload: the four sparse streams, then one section per "whole" tensor, in
                  header order; the lengths are in the header

The whole object is exactly 32 + H + P bytes; anything shorter or longer is corrupt. The
container checksum makes any damaged byte (a torn upload, a truncated read) a `CorruptDelta` before
anything is decoded; the per-tensor checksums below are a different check, of the *result*.

Header JSON::

    {"base_version": int or null,   # null: a keyframe, applies to any state of the right layout
     "new_version": int,            # the version the target holds once this is applied
     "streams": [[length, raw_length], x 4],  # the sparse streams of `sections`, in order
     "tensors": [                   # every tensor of the state dict, in the trainer's order
       {"name": str, "dtype": str,  # torch dtype name without "torch.", e.g. "bfloat16"
        "shape": [int, ...],        # [] for a scalar
        "kind": "same" | "sparse" | "whole",
        "count": int,               # changed elements (sparse), numel (whole), 0 (same)
        "length": int,              # bytes of its section ("whole"), else 0
        "raw_length": int,          # bytes the section decodes to ("whole"), else 0
        "xxh3": str}]}              # 16 hex digits: xxh3_64 of the resulting tensor's bytes

A stream or section whose length equals its raw_length is stored as is, otherwise it is one zstd
frame. The encoder version (prelude) says how sections are laid out (see `sections`).

JSON keeps the header readable with any tool and lets fields be added; compressed, it costs a few
dozen bytes per tensor, noise next to the millions of changed elements of a real model.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import struct
import sys
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, TypeVar

import xxhash
import zstandard

from polyrl.workers.deltas import errors

if sys.byteorder != "little":
    raise ImportError("the delta codec assumes a little-endian host")

MAGIC = b"PLRD"
ENCODER_VERSION = 1
PRELUDE = struct.Struct("<4sHHIIQQ")
SPARSE_STREAMS = 4  # gap symbols, value symbols, gap escapes, value escapes: see `sections`
_UNCHECKED = 24  # prelude bytes covered by the checksum: all but the checksum itself
_MAX_HEADER = 1 << 30
_T = TypeVar("_T")
Blob = bytes | bytearray | memoryview  # an object as encoded, or as the store read it


class Kind(StrEnum):
    SAME = "same"
    SPARSE = "sparse"
    WHOLE = "whole"


@dataclasses.dataclass(slots=True, frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: Kind
    count: int
    length: int
    raw_length: int
    xxh3: int


@dataclasses.dataclass(slots=True, frozen=True)
class Header:
    base_version: int | None
    new_version: int
    streams: tuple[tuple[int, int], ...]  # (length, raw_length) of each sparse stream
    tensors: tuple[TensorEntry, ...]

    @property
    def is_keyframe(self) -> bool:
        return self.base_version is None


def pack(header: Header, streams: Sequence[bytes], wholes: Sequence[bytes]) -> bytes:
    """The container: header, the sparse streams, then the sections of whole tensors."""
    parts = [*streams, *wholes]
    if _lengths(header) != [len(part) for part in parts]:
        raise ValueError("streams and sections do not match the header's lengths")
    text = json.dumps(_header_to_json(header), separators=(",", ":")).encode()
    # Level 1: on a 6.5 KB header (39 tensors) level 19 saved 3 bytes and took 6.4 ms, against
    # 0.05 ms; on a small model that was a third of the whole encode.
    zheader = zstandard.ZstdCompressor(level=1).compress(text)
    payload_length = sum(len(part) for part in parts)
    head = PRELUDE.pack(MAGIC, ENCODER_VERSION, 0, len(zheader), len(text), payload_length, 0)
    hasher = xxhash.xxh3_64(head[:_UNCHECKED])
    hasher.update(zheader)
    for part in parts:
        hasher.update(part)
    checksum = struct.pack("<Q", hasher.intdigest())
    return b"".join([head[:_UNCHECKED], checksum, zheader, *parts])


def unpack(blob: Blob) -> tuple[Header, list[memoryview], list[memoryview]]:
    """Header, sparse streams and whole sections, after checking the container."""
    view = memoryview(blob)
    if len(view) < PRELUDE.size:
        raise errors.CorruptDelta(f"{len(view)} bytes is shorter than the prelude")
    magic, version, flags, hlen, jlen, plen, checksum = PRELUDE.unpack_from(view)
    if magic != MAGIC:
        raise errors.CorruptDelta(f"bad magic {bytes(magic)!r}")
    if version != ENCODER_VERSION or flags != 0:
        raise errors.CorruptDelta(f"unsupported encoder version {version} / flags {flags}")
    if PRELUDE.size + hlen + plen != len(view) or jlen > _MAX_HEADER:
        raise errors.CorruptDelta("lengths in the prelude do not match the object (truncated?)")
    hasher = xxhash.xxh3_64(view[:_UNCHECKED])
    hasher.update(view[PRELUDE.size :])
    if hasher.intdigest() != checksum:
        raise errors.CorruptDelta("container checksum mismatch")
    header = _parse_header(view[PRELUDE.size : PRELUDE.size + hlen], jlen)
    parts = _split_payload(_lengths(header), view[PRELUDE.size + hlen :])
    return header, parts[: len(header.streams)], parts[len(header.streams) :]


def read_header(blob: Blob) -> Header:
    return unpack(blob)[0]


def _lengths(header: Header) -> list[int]:
    wholes = [t.length for t in header.tensors if t.kind is Kind.WHOLE]
    return [length for length, _ in header.streams] + wholes


def _split_payload(lengths: list[int], payload: memoryview) -> list[memoryview]:
    offsets = [0, *itertools.accumulate(lengths)]
    if offsets[-1] != len(payload):
        raise errors.CorruptDelta("stream and section lengths do not add up to the payload")
    return [payload[start:end] for start, end in itertools.pairwise(offsets)]


def _header_to_json(header: Header) -> dict[str, Any]:
    # Field by field rather than `dataclasses.asdict`, which deep-copies every value: on a
    # 39-tensor model that was a fifth of the encode's Python time.
    tensors = [
        {
            "name": t.name,
            "dtype": t.dtype,
            "shape": list(t.shape),
            "kind": str(t.kind),
            "count": t.count,
            "length": t.length,
            "raw_length": t.raw_length,
            "xxh3": f"{t.xxh3:016x}",
        }
        for t in header.tensors
    ]
    return {
        "base_version": header.base_version,
        "new_version": header.new_version,
        "streams": [list(stream) for stream in header.streams],
        "tensors": tensors,
    }


def _parse_header(zheader: memoryview, jlen: int) -> Header:
    try:
        text = zstandard.ZstdDecompressor().decompress(zheader, max_output_size=jlen)
        doc = json.loads(text)
        tensors = tuple(_parse_entry(t) for t in doc["tensors"])
        base = None if doc["base_version"] is None else _count(doc["base_version"])
        streams = tuple(_stream(stream) for stream in doc["streams"])
        header = Header(base, _count(doc["new_version"]), streams, tensors)
    except (zstandard.ZstdError, ValueError, KeyError, TypeError) as exc:
        raise errors.CorruptDelta(f"unreadable header: {exc}") from exc
    if (
        len(text) != jlen
        or len({t.name for t in tensors}) != len(tensors)
        or len(streams) != SPARSE_STREAMS
    ):
        raise errors.CorruptDelta("header length, streams or tensor names are inconsistent")
    return header


def _parse_entry(doc: dict[str, Any]) -> TensorEntry:
    shape = tuple(_count(d) for d in doc["shape"])
    entry = TensorEntry(
        name=_typed(doc["name"], str),
        dtype=_typed(doc["dtype"], str),
        shape=shape,
        kind=Kind(doc["kind"]),
        count=_count(doc["count"]),
        length=_count(doc["length"]),
        raw_length=_count(doc["raw_length"]),
        xxh3=int(_typed(doc["xxh3"], str), 16),
    )
    numel = math.prod(shape)
    no_section = entry.length == 0 and entry.raw_length == 0
    valid = {
        Kind.SAME: entry.count == 0 and no_section,
        Kind.SPARSE: 0 < entry.count <= numel and no_section,
        Kind.WHOLE: entry.count == numel and entry.length <= entry.raw_length,
    }
    if not valid[entry.kind]:
        raise ValueError(f"{entry.name}: inconsistent {entry.kind} entry")
    return entry


def _stream(doc: object) -> tuple[int, int]:
    length, raw_length = _typed(doc, list)
    if _count(length) > _count(raw_length):
        raise ValueError("stream longer than its raw length")
    return length, raw_length


def _typed(value: object, kind: type[_T]) -> _T:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


def _count(value: object) -> int:
    number = _typed(value, int)
    if number < 0:
        raise ValueError(f"negative count {number}")
    return number
