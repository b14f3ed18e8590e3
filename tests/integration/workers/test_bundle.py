"""The model bundle travels through the job's Object Store, weights excluded."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import nats
import pytest

from polyrl.api import natsconfig
from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.workers.weightsync import bundle


async def test_a_published_bundle_is_fetched_without_its_weights(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer.json").write_text('{"version": "1.0"}')
    (model / "model.safetensors").write_bytes(b"\0" * 1024)
    names = JobNames(namespace="t", job="bundle")
    nc = await nats.connect(nats_server.url)
    try:
        await natsconfig.ensure(nc.jetstream(), names, ["solver"])
        await bundle.publish(nc.jetstream(), names, "solver", model)
        got = await bundle.fetch(nc.jetstream(), names, "solver", tmp_path / "got", timeout=5)
    finally:
        await nc.close()
    assert sorted(p.name for p in got.iterdir()) == ["config.json", "tokenizer.json"]
    assert (got / "config.json").read_text() == '{"model_type": "llama"}'


async def test_waiting_for_a_bundle_that_never_comes_fails_clearly(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    names = JobNames(namespace="t", job="nobundle")
    nc = await nats.connect(nats_server.url)
    try:
        await natsconfig.ensure(nc.jetstream(), names, ["solver"])
        with pytest.raises(bundle.BundleMissing, match="is its trainer running"):
            await bundle.fetch(nc.jetstream(), names, "solver", tmp_path, timeout=1, poll=0.2)
    finally:
        await nc.close()


def test_a_bundle_with_paths_outside_its_directory_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"owned"
        info = tarfile.TarInfo("../escape.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.OutsideDestinationError):
        bundle.unpack(buffer.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()
