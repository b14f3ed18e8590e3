"""Where encoding runs: a thread of the caller or a child process, with the same bytes out."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from multiprocessing.context import SpawnProcess
from pathlib import Path

import pytest
import torch

from polyrl.workers.deltas import decode, encode
from polyrl.workers.deltas.encoders import Encoder
from polyrl.workers.deltas.encoders import process as process_module
from polyrl.workers.deltas.encoders.inline import InlineEncoder
from polyrl.workers.deltas.encoders.process import ProcessEncoder, plan_layout, views

State = dict[str, torch.Tensor]


def states(count: int) -> list[State]:
    """Consecutive versions of a model-like state: sparse changes, odd shapes, a scalar, empty."""
    generator = torch.Generator().manual_seed(0)
    first = {
        "embed.weight": torch.randn(300, 17, generator=generator).to(torch.bfloat16),
        "layers.0.mlp": torch.randn(70_001, generator=generator).to(torch.bfloat16),  # batches
        "norm.weight": torch.ones(17, dtype=torch.float32),
        "scale": torch.tensor(0.5, dtype=torch.float16),
        "empty": torch.empty(0, 3, dtype=torch.bfloat16),
        "steps": torch.tensor([3], dtype=torch.int64),
    }
    out = [first]
    for _ in range(count - 1):
        new = {name: t.clone() for name, t in out[-1].items()}
        for tensor in new.values():
            if tensor.is_floating_point() and tensor.numel():
                flat = tensor.view(-1)
                picked = torch.rand(flat.numel(), generator=generator) < 0.02
                flat[picked] = flat[picked] * 1.01
        new["steps"] += 1
        out.append(new)
    return out


def same_bits(a: State, b: State) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))
        for k in a
    )


@pytest.fixture(scope="module")
def child() -> Iterator[ProcessEncoder]:
    """One child for the tests that leave it running (each start imports torch: seconds)."""
    made = ProcessEncoder()
    yield made
    made.close()


@pytest.fixture(params=["inline", "process"])
def encoder(request: pytest.FixtureRequest, child: ProcessEncoder) -> Encoder:
    return InlineEncoder() if request.param == "inline" else child


def publish_all(encoder: Encoder, versions: list[State]) -> list[tuple[bytes, bytes | None]]:
    """Keyframe and delta (from the previous version) of each version, as a publisher makes them."""
    out: list[tuple[bytes, bytes | None]] = []
    published = None
    for version, state in enumerate(versions):
        snapshot = encoder.snapshot(state, keep=published)
        keyframe = encoder.keyframe(snapshot, version=version)
        delta = None
        if published is not None:
            delta = encoder.delta(
                published, snapshot, base_version=version - 1, new_version=version
            )
        out.append((keyframe, delta))
        published = snapshot
    return out


def test_every_encoder_makes_the_bytes_the_codec_makes(encoder: Encoder) -> None:
    versions = states(4)
    for version, (keyframe, delta) in enumerate(publish_all(encoder, versions)):
        assert keyframe == encode.encode_keyframe(versions[version], version=version)
        if version:
            expected = encode.encode_delta(
                versions[version - 1],
                versions[version],
                base_version=version - 1,
                new_version=version,
            )
            assert delta == expected


def test_a_snapshot_leaves_the_published_one_untouched(encoder: Encoder) -> None:
    first, second, third = states(3)
    published = encoder.snapshot(first, keep=None)
    newer = encoder.snapshot(second, keep=published)
    assert same_bits(published, first)
    assert same_bits(newer, second)
    newest = encoder.snapshot(third, keep=newer)  # may reuse the older one's memory
    assert same_bits(newer, second)
    assert same_bits(newest, third)
    assert not same_bits(newer, newest)


def test_deltas_from_the_child_apply_bit_identically(child: ProcessEncoder) -> None:
    versions = states(3)
    made = publish_all(child, versions)
    assert child.pid is not None  # made there, not inline
    _, replica = decode.load_keyframe(made[0][0])
    for version, (_, delta) in enumerate(made[1:], start=1):
        assert delta is not None
        decode.apply_delta(replica, delta, have_version=version - 1)
        assert same_bits(replica, versions[version])


def test_a_dead_child_is_logged_and_encoding_goes_on_in_the_trainer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second, third = states(3)
    encoder = ProcessEncoder()
    try:
        published = encoder.snapshot(first, keep=None)
        encoder.keyframe(published, version=0)
        pid = encoder.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        newer = encoder.snapshot(second, keep=published)
        with caplog.at_level(logging.ERROR):
            delta = encoder.delta(published, newer, base_version=0, new_version=1)
        assert encoder.pid is None
        assert f"pid {pid}" in caplog.text
        assert "encoding in the trainer" in caplog.text
        assert delta == encode.encode_delta(first, second, base_version=0, new_version=1)
        newest = encoder.snapshot(third, keep=newer)
        assert encoder.delta(newer, newest, base_version=1, new_version=2) == encode.encode_delta(
            second, third, base_version=1, new_version=2
        )
    finally:
        encoder.close()


def test_without_room_in_shared_memory_encoding_stays_in_the_trainer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(process_module, "shm_free", lambda: 1000)
    first, second = states(2)
    encoder = ProcessEncoder()
    try:
        pid = encoder.pid
        with caplog.at_level(logging.WARNING):
            published = encoder.snapshot(first, keep=None)
        assert encoder.pid is None
        assert "stays in the trainer" in caplog.text
        assert "/dev/shm" in caplog.text
        assert pid is not None
        assert not Path(f"/proc/{pid}").exists()
        newer = encoder.snapshot(second, keep=published)
        delta = encoder.delta(published, newer, base_version=0, new_version=1)
        assert delta == encode.encode_delta(first, second, base_version=0, new_version=1)
    finally:
        encoder.close()


def test_closing_stops_the_child() -> None:
    encoder = ProcessEncoder()
    pid = encoder.pid
    assert pid is not None
    assert Path(f"/proc/{pid}").exists()
    encoder.close()
    encoder.close()  # idempotent
    assert encoder.pid is None
    assert not Path(f"/proc/{pid}").exists()


def test_a_state_of_another_layout_is_refused(child: ProcessEncoder) -> None:
    first, second = states(2)
    renamed = {("x" + k): v for k, v in second.items()}
    reshaped = {**second, "embed.weight": second["embed.weight"].reshape(17, 300)}
    published = child.snapshot(first, keep=None)
    with pytest.raises(ValueError, match="other tensors"):
        child.snapshot(renamed, keep=published)
    with pytest.raises(RuntimeError):
        child.snapshot(reshaped, keep=published)


def test_slots_lay_tensors_out_on_cache_lines_in_one_buffer() -> None:
    state = states(1)[0]
    layout, size = plan_layout(state)
    offsets = [offset for *_, offset in layout]
    assert all(offset % 64 == 0 for offset in offsets)
    assert offsets == sorted(offsets)
    flat = torch.zeros(size, dtype=torch.uint8)
    slot = views(flat, layout)
    for name, tensor in state.items():
        slot[name].copy_(tensor)
    assert same_bits(slot, state)
    assert all(t.untyped_storage().data_ptr() == flat.data_ptr() for t in slot.values())


def test_a_request_the_child_cannot_serve_is_raised_and_it_keeps_serving(
    child: ProcessEncoder,
) -> None:
    with pytest.raises(RuntimeError, match="unknown request 'bogus'"):
        child._call(("bogus",))
    first, second = states(2)
    published = child.snapshot(first, keep=None)
    newer = child.snapshot(second, keep=published)
    assert child.delta(published, newer, base_version=0, new_version=1) == encode.encode_delta(
        first, second, base_version=0, new_version=1
    )
    assert child.pid is not None


def test_without_an_encoder_process_encoding_stays_in_the_trainer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: SpawnProcess) -> None:
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(SpawnProcess, "start", refuse)
    with caplog.at_level(logging.WARNING):
        encoder = ProcessEncoder()
    assert encoder.pid is None
    assert "no encoder process (Resource temporarily unavailable)" in caplog.text
    first, second = states(2)
    published = encoder.snapshot(first, keep=None)
    newer = encoder.snapshot(second, keep=published)
    delta = encoder.delta(published, newer, base_version=0, new_version=1)
    assert delta == encode.encode_delta(first, second, base_version=0, new_version=1)
    encoder.close()
