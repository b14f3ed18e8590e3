"""Byte layouts that let zstd's order-0 entropy coder see the statistics of the data.

zstd codes literals with Huffman over bytes, so it compresses well only what is laid out as bytes
that each follow one distribution. Two layouts do that here:

- Byte planes: an array of k-byte integers stored as k runs, least significant byte of every element
  first, then the next byte, and so on. The high bytes of gaps and of raw bf16 words (sign and
  exponent) are nearly constant and compress to almost nothing; mixed with the noisy low bytes they
  would not.
- Small symbols with escapes: a stream of mostly small integers stored as one symbol per value,
  min(value, cap), with cap = 2**bits - 1 meaning "escape", and the escaped values' remainders
  (value - cap) in a separate byte-plane stream. Gaps use 8-bit symbols; the changed values, whose
  zigzagged deltas are mostly 1 or 2, use 4-bit symbols two to a byte, because Huffman cannot spend
  less than one bit on a symbol and most of a value's information is its sign. Measured on bf16
  training deltas at lr 1e-6: gaps 1.02 bytes per changed element (fixed 2-byte planes 1.08,
  LEB128 varints 1.10; the entropy of the gaps is 0.99), values 0.26 bytes (one byte per symbol
  0.32).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.unsignedinteger]


def split_planes(values: Ints) -> Bytes:
    """Byte planes of `values`, least significant plane first."""
    width = values.dtype.itemsize
    return np.ascontiguousarray(values.view(np.uint8).reshape(-1, width).T).reshape(-1)


def join_planes(planes: Bytes, dtype: type[np.unsignedinteger]) -> Ints:
    width = np.dtype(dtype).itemsize
    return np.ascontiguousarray(planes.reshape(width, -1).T).view(dtype).reshape(-1)


def symbols_length(count: int, bits: int) -> int:
    """Bytes that `count` symbols of `bits` bits take."""
    per_byte = 8 // bits
    return -(-count // per_byte)


def to_symbols(values: Ints, bits: int) -> tuple[Bytes, Ints]:
    """Capped symbols (packed 8 // bits to a byte) and the escaped remainders."""
    symbols, escapes = capped(values, bits)
    return (pack_nibbles(symbols) if bits == 4 else symbols), escapes


def capped(values: Ints, bits: int) -> tuple[Bytes, Ints]:
    """Each value capped at 2**bits - 1, one per byte, and how far each capped one was over."""
    cap = (1 << bits) - 1
    symbols = np.minimum(values, cap).astype(np.uint8)
    return symbols, values[symbols == cap] - values.dtype.type(cap)


def pack_nibbles(symbols: Bytes) -> Bytes:
    """4-bit symbols two to a byte, low nibble first; an odd count leaves the last high one 0."""
    padded = np.zeros(symbols_length(len(symbols), 4) * 2, dtype=np.uint8)
    padded[: len(symbols)] = symbols
    packed: Bytes = padded[0::2] | (padded[1::2] << np.uint8(4))
    return packed


def from_symbols(packed: Bytes, count: int, bits: int) -> Bytes:
    """The `count` capped symbols stored in `packed`, one per byte."""
    if bits == 8:
        return packed[:count]
    symbols = np.empty(len(packed) * 2, dtype=np.uint8)
    symbols[0::2] = packed & 0x0F
    symbols[1::2] = packed >> 4
    return symbols[:count]


def with_escapes(symbols: Bytes, escapes: Ints, bits: int) -> Ints:
    """The values again: symbols widened, each escape symbol plus its remainder."""
    cap = (1 << bits) - 1
    values = symbols.astype(escapes.dtype)
    values[symbols == cap] += escapes
    return values
