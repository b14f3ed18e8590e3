"""The sparse weight-delta codec: bit-identical round trips, and refusals that touch nothing."""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import xxhash
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyrl.workers.deltas import decode, diff, encode, errors, format, threads
from polyrl.workers.deltas.format import Kind

FLOATS = [torch.bfloat16, torch.float16, torch.float32]
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NP_VIEW = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def from_bits(bits: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    signed = bits.view(_NP_VIEW[bits.dtype.itemsize]).copy()
    return torch.from_numpy(signed).view(dtype).reshape(shape)


def bits_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(_INT_VIEW[tensor.element_size()])


def same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(bits_of(a[k]), bits_of(b[k])) for k in a)


def clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in state.items()}


def special_bits(dtype: torch.dtype) -> list[int]:
    """+0, -0, +inf, a quiet NaN, a NaN with another payload, a negative NaN, a subnormal."""
    width = torch.finfo(dtype).bits
    exponent = {torch.bfloat16: 8, torch.float16: 5, torch.float32: 8}[dtype]
    mantissa = width - 1 - exponent
    sign, inf = 1 << (width - 1), ((1 << exponent) - 1) << mantissa
    return [0, sign, inf, inf | (1 << (mantissa - 1)), inf | 1, sign | inf | 3, 1]


@st.composite
def tensor_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """An old tensor of random bits (specials included) and a new one changed at a random rate."""
    dtype = draw(st.sampled_from(FLOATS))
    shape = draw(
        st.one_of(
            st.lists(st.integers(0, 9), max_size=3).map(tuple),
            st.integers(0, 3000).map(lambda n: (n,)),
        )
    )
    rate = draw(st.one_of(st.sampled_from([0.0, 0.001, 0.01, 0.5, 1.0]), st.floats(0, 1)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    width = torch.finfo(dtype).bits
    kind = {16: np.uint16, 32: np.uint32}[width]
    numel = math.prod(shape)
    old = rng.integers(0, 1 << width, numel, dtype=np.uint64).astype(kind)
    specials = np.array(special_bits(dtype), dtype=kind)
    special = rng.random(numel) < 0.05
    old[special] = rng.choice(specials, size=int(special.sum()))
    changed = rng.random(numel) < rate
    steps = np.array([1, 2, (1 << width) - 1], dtype=np.uint64)
    nudged = old + rng.choice(steps, size=numel).astype(kind)
    flipped = old ^ kind(1 << (width - 1))
    random = rng.integers(0, 1 << width, numel, dtype=np.uint64).astype(kind)
    how = rng.integers(0, 3, numel)
    candidate = np.where(how == 0, nudged, np.where(how == 1, flipped, random))
    new = np.where(changed, candidate, old).astype(kind)
    return from_bits(old, dtype, shape), from_bits(new, dtype, shape)


@st.composite
def state_pairs(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    pairs = draw(st.lists(tensor_pairs(), max_size=4))
    names = [f"layers.{i}.weight" for i in range(len(pairs))]
    return dict(zip(names, (p[0] for p in pairs), strict=True)), dict(
        zip(names, (p[1] for p in pairs), strict=True)
    )


PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(state_pairs())
def test_applying_a_delta_gives_bit_identical_weights(states):
    old, new = states
    blob = encode.encode_delta(old, new, base_version=6, new_version=7)
    target = clone(old)
    header = decode.apply_delta(target, blob, have_version=6)
    assert same_bits(target, new)
    assert header.new_version == 7
    assert all(t.length <= t.raw_length for t in header.tensors)


@PROPERTY
@given(state_pairs())
def test_a_keyframe_round_trips_bit_for_bit(states):
    _, new = states
    blob = encode.encode_keyframe(new, version=3)
    header, loaded = decode.load_keyframe(blob)
    assert same_bits(loaded, new)
    assert header.is_keyframe
    assert all(t.kind is Kind.WHOLE for t in header.tensors)


def small_states(rate: float = 0.01) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    old = {
        "embed.weight": (torch.randn(64, 48, generator=generator) * 0.02).to(torch.bfloat16),
        "norm.weight": torch.ones(48, dtype=torch.bfloat16),
        "head.weight": (torch.randn(33, 48, generator=generator) * 0.02).to(torch.bfloat16),
    }
    new = clone(old)
    for name in ("embed.weight", "head.weight"):
        flat = bits_of(new[name])
        mask = torch.rand(flat.shape, generator=generator) < rate
        mask[0] = True
        flat[mask] += 1
    return old, new


def test_unchanged_tensors_and_empty_deltas_cost_only_their_header_line():
    old, _ = small_states()
    blob = encode.encode_delta(old, clone(old), base_version=1, new_version=2)
    target = clone(old)
    header = decode.apply_delta(target, blob, have_version=1)
    assert all(t.kind is Kind.SAME for t in header.tensors)
    assert header.streams == ((0, 0),) * 4
    assert same_bits(target, old)
    empty = encode.encode_delta({}, {}, base_version=1, new_version=2)
    assert decode.apply_delta({}, empty, have_version=1).tensors == ()


def test_signed_zeros_and_nan_payloads_count_as_changes():
    old = torch.tensor([0.0, float("nan"), 1.0, -0.0], dtype=torch.bfloat16)
    new = old.clone()
    bits_of(new)[0] = torch.tensor(-0.0, dtype=torch.bfloat16).view(torch.int16)
    bits_of(new)[1] ^= 1  # another NaN payload; a float comparison sees NaN != NaN either way
    blob = encode.encode_delta({"w": old}, {"w": new}, base_version=0, new_version=1)
    (entry,) = format.read_header(blob).tensors
    assert (entry.kind, entry.count) == (Kind.SPARSE, 2)
    target = {"w": old.clone()}
    decode.apply_delta(target, blob, have_version=0)
    assert same_bits(target, {"w": new})


def test_a_tensor_whose_delta_would_be_larger_than_itself_is_sent_whole():
    old, _ = small_states()
    new = clone(old)
    new["embed.weight"] = torch.randn(64, 48).to(torch.bfloat16)  # every element, random bits
    new["head.weight"][0, 0] += 1.0
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    kinds = {t.name: t.kind for t in format.read_header(blob).tensors}
    assert kinds == {
        "embed.weight": Kind.WHOLE,
        "norm.weight": Kind.SAME,
        "head.weight": Kind.SPARSE,
    }
    target = clone(old)
    decode.apply_delta(target, blob, have_version=1)
    assert same_bits(target, new)


def test_integer_and_bool_tensors_round_trip_too():
    old = {
        "steps": torch.tensor([3, -1, 2**40], dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
    }
    new = {"steps": torch.tensor([4, -1, -(2**40)]), "mask": torch.tensor([True, True, True])}
    target = clone(old)
    decode.apply_delta(
        target, encode.encode_delta(old, new, base_version=0, new_version=1), have_version=0
    )
    assert same_bits(target, new)


def test_long_gaps_and_large_value_jumps_round_trip_through_the_escape_streams():
    old = {"w": torch.zeros(100_003, dtype=torch.bfloat16), "f": torch.zeros(7)}
    new = clone(old)
    new["w"][[0, 300, 70_000, 100_002]] = torch.tensor([1e-40, -3.0, float("inf"), 1e30]).to(
        torch.bfloat16
    )
    new["f"][6] = -1.0
    blob = encode.encode_delta(old, new, base_version=0, new_version=1)
    header = format.read_header(blob)
    assert [t.kind for t in header.tensors] == [Kind.SPARSE, Kind.SPARSE]
    gap_escapes, value_escapes = header.streams[2:]
    assert gap_escapes[1] > 0  # a gap of 69 699
    assert value_escapes[1] > 0  # 0 -> inf and friends
    target = clone(old)
    decode.apply_delta(target, blob, have_version=0)
    assert same_bits(target, new)


@pytest.mark.parametrize("kind", [np.uint8, np.uint16, np.uint32, np.uint64])
# The last size spans two chunks of 8-bit elements and more of the wider kinds, with a tail.
@pytest.mark.parametrize("numel", [0, 1, 7, 13, 4099, 300_001, 2 * diff.CHUNK_WORDS * 8 + 5])
def test_the_scan_finds_exactly_the_elements_whose_bits_differ(kind, numel):
    rng = np.random.default_rng(numel)
    old = rng.integers(0, 256, numel).astype(kind)
    new = old.copy()
    new[rng.random(numel) < 0.05] ^= kind(1 << (8 * np.dtype(kind).itemsize - 1))
    changes = diff.scan(old, new)
    expected = np.flatnonzero(old != new)
    np.testing.assert_array_equal(changes.positions, expected)
    np.testing.assert_array_equal(changes.old, old[expected])
    np.testing.assert_array_equal(changes.new, new[expected])
    assert changes.checksum == xxhash.xxh3_64_intdigest(new.tobytes())


@pytest.mark.parametrize("keep", [0, 10, 31, 32, -1])
def test_decoding_a_truncated_delta_is_refused_and_leaves_the_target_unchanged(keep):
    old, new = small_states()
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    target = clone(old)
    with pytest.raises(errors.CorruptDelta):
        decode.apply_delta(target, blob[:keep], have_version=1)
    assert same_bits(target, old)


def test_a_flipped_byte_anywhere_in_the_object_is_refused_as_corrupt():
    old, new = small_states()
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    target = clone(old)
    for offset in range(len(blob)):
        damaged = bytearray(blob)
        damaged[offset] ^= 0x40
        with pytest.raises(errors.CorruptDelta):
            decode.apply_delta(target, bytes(damaged), have_version=1)
    assert same_bits(target, old)


def resign(blob: bytes) -> bytes:
    """`blob` with a container checksum that matches its (edited) contents."""
    hasher = xxhash.xxh3_64(blob[:24])
    hasher.update(blob[32:])
    return blob[:24] + struct.pack("<Q", hasher.intdigest()) + blob[32:]


def with_header(blob: bytes, edit: Callable[[dict[str, Any]], object]) -> bytes:
    """`blob` with its header JSON passed through `edit`, the container re-signed."""
    _, _, _, hlen, _, plen, _ = format.PRELUDE.unpack_from(blob)
    doc = json.loads(zstandard.ZstdDecompressor().decompress(blob[32 : 32 + hlen]))
    text = json.dumps(edit(doc)).encode()
    zheader = zstandard.ZstdCompressor().compress(text)
    prelude = format.PRELUDE.pack(format.MAGIC, 1, 0, len(zheader), len(text), plen, 0)
    return resign(prelude + zheader + blob[32 + hlen :])


def test_an_unknown_encoder_version_is_refused_even_with_a_valid_checksum():
    old, new = small_states()
    blob = bytearray(encode.encode_delta(old, new, base_version=1, new_version=2))
    blob[4] = 2
    with pytest.raises(errors.CorruptDelta, match="encoder version"):
        decode.apply_delta(clone(old), resign(bytes(blob)), have_version=1)


def test_a_header_that_does_not_match_its_payload_is_refused_as_corrupt():
    old, new = small_states()
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)

    def more_changes(doc):
        doc["tensors"][0]["count"] += 1
        return doc

    target = clone(old)
    with pytest.raises(errors.CorruptDelta):
        decode.apply_delta(target, with_header(blob, more_changes), have_version=1)
    assert same_bits(target, old)


@pytest.mark.parametrize(("index", "kind"), [(0, Kind.WHOLE), (1, Kind.SAME), (2, Kind.SPARSE)])
def test_a_result_checksum_mismatch_is_refused_and_rolled_back(index, kind):
    old, new = small_states()
    new["embed.weight"] = torch.randn(64, 48).to(torch.bfloat16)  # sent whole
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    assert format.read_header(blob).tensors[index].kind is kind

    def wrong_checksum(doc):
        entry = doc["tensors"][index]
        entry["xxh3"] = f"{int(entry['xxh3'], 16) ^ 1:016x}"
        return doc

    target = clone(old)
    with pytest.raises(errors.ChecksumMismatch, match=re.escape(list(old)[index])):
        decode.apply_delta(target, with_header(blob, wrong_checksum), have_version=1)
    assert same_bits(target, old)


@pytest.mark.parametrize("name", ["embed.weight", "norm.weight", "head.weight"])
def test_a_target_that_diverged_from_the_base_is_refused_and_left_as_it_was(name):
    old, new = small_states()
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    diverged = clone(old)
    bits_of(diverged[name])[5] += 7
    target = clone(diverged)
    with pytest.raises(errors.ChecksumMismatch):
        decode.apply_delta(target, blob, have_version=1)
    assert same_bits(target, diverged)


def test_a_delta_for_another_base_version_is_refused():
    old, new = small_states()
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    target = clone(old)
    for have in (0, 2, None):
        with pytest.raises(errors.BaseVersionMismatch):
            decode.apply_delta(target, blob, have_version=have)
    with pytest.raises(errors.BaseVersionMismatch):
        decode.load_keyframe(blob)
    assert same_bits(target, old)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update({"norm.weight": torch.ones(47, dtype=torch.bfloat16)}),
        lambda s: s.update({"norm.weight": torch.ones(48, dtype=torch.float16)}),
        lambda s: s.pop("norm.weight"),
        lambda s: s.update({"extra": torch.zeros(1)}),
        lambda s: s.update({"norm.weight": torch.ones(96, dtype=torch.bfloat16)[::2]}),
    ],
    ids=["shape", "dtype", "missing", "extra", "non-contiguous"],
)
def test_a_target_whose_layout_differs_from_the_header_is_refused(change):
    old, new = small_states()
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    target = clone(old)
    change(target)
    before = clone(target)
    with pytest.raises(errors.TargetMismatch):
        decode.apply_delta(target, blob, have_version=1)
    assert same_bits(target, before)


def test_a_keyframe_applies_whatever_version_the_target_holds():
    old, new = small_states(rate=0.3)
    blob = encode.encode_keyframe(new, version=9)
    target = clone(old)
    assert decode.apply_delta(target, blob, have_version=None).new_version == 9
    assert same_bits(target, new)


def test_a_sparse_delta_is_far_smaller_than_coo_and_the_full_tensor():
    generator = torch.Generator().manual_seed(1)
    old = {"w": (torch.randn(200_000, generator=generator) * 0.02).to(torch.bfloat16)}
    new = clone(old)
    flat = bits_of(new["w"])
    mask = torch.rand(flat.shape, generator=generator) < 0.01
    flat[mask] += (
        torch.randint(0, 2, flat.shape, generator=generator, dtype=torch.int16)[mask] * 2 - 1
    )
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    changed = format.read_header(blob).tensors[0].count
    assert changed == int(mask.sum())
    assert len(blob) / changed < 6 / 4.3  # COO: a u32 index and a bf16 value, 6 bytes
    assert len(blob) < old["w"].nbytes / 100


def tied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with head.weight the very tensor of embed.weight, as with tied embeddings."""
    return {**state, "head.weight": state["embed.weight"]}


def test_tied_weights_are_patched_once_whether_or_not_the_target_ties_them():
    old, new = (tied(s) for s in small_states())
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    tied_target, untied_target = tied(clone(old)), clone(old)
    decode.apply_delta(tied_target, blob, have_version=1)
    decode.apply_delta(untied_target, blob, have_version=1)
    assert same_bits(tied_target, new)
    assert same_bits(untied_target, new)
    assert tied_target["head.weight"] is tied_target["embed.weight"]


def test_a_target_tied_where_the_trainer_is_not_is_refused():
    old, new = small_states()
    new["head.weight"] = new["embed.weight"].clone()
    old["head.weight"] = old["embed.weight"].clone()
    new["head.weight"][0, 0] = 5.0
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    target = tied(clone(old))
    with pytest.raises(errors.TargetMismatch, match="tied"):
        decode.apply_delta(target, blob, have_version=1)


def test_targets_that_overlap_in_memory_are_refused():
    old, new = small_states()
    blob = encode.encode_delta(old, new, base_version=1, new_version=2)
    buffer = torch.zeros(48 + 33 * 48, dtype=torch.bfloat16)
    target = {
        **clone(old),
        "norm.weight": buffer[:48],
        "head.weight": buffer[47 : 47 + 33 * 48].view(33, 48),  # shares one element
    }
    with pytest.raises(errors.TargetMismatch, match="overlap"):
        decode.apply_delta(target, blob, have_version=1)


def test_a_small_model_is_coded_on_one_thread_unless_told_otherwise() -> None:
    assert threads.for_size(threads.PARALLEL_MIN_BYTES - 1, None) == 1
    assert threads.for_size(threads.PARALLEL_MIN_BYTES, None) is None  # torch's thread count
    assert threads.for_size(1024, 4) == 4


@PROPERTY
@given(state_pairs())
def test_small_tensors_coded_together_give_the_bytes_of_coding_them_one_by_one(states):
    old, new = states
    together = encode.encode_delta(old, new, base_version=1, new_version=2)
    saved = encode.BATCH_MAX_NUMEL
    encode.BATCH_MAX_NUMEL = 0  # every tensor on its own
    try:
        alone = encode.encode_delta(old, new, base_version=1, new_version=2)
    finally:
        encode.BATCH_MAX_NUMEL = saved
    assert together == alone


def test_a_batch_mixing_dtypes_odd_counts_and_unchanged_tensors_round_trips():
    rng = np.random.default_rng(3)
    old = {
        "a": torch.randn(7, dtype=torch.float32).to(torch.bfloat16),
        "b": torch.randn(5, 3, dtype=torch.float16),
        "c": torch.randn(11, dtype=torch.float32),
        "d": torch.arange(9, dtype=torch.int16),
        "e": torch.zeros(4, dtype=torch.bfloat16),
    }
    new = clone(old)
    for name in ("a", "b", "c", "d"):  # an odd number of changes in each, "e" unchanged
        flat = bits_of(new[name])
        for i in rng.choice(flat.numel(), size=3, replace=False):
            flat[int(i)] += 1
    blob = encode.encode_delta(old, new, base_version=0, new_version=1)
    kinds = {t.name: t.kind for t in format.read_header(blob).tensors}
    assert kinds["e"] is Kind.SAME
    assert kinds["a"] is Kind.SPARSE
    target = clone(old)
    decode.apply_delta(target, blob, have_version=0)
    assert same_bits(target, new)
