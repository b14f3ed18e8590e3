"""The model bundle: config and tokenizer, published once by the trainer, fetched by rollouts.

Rollout workers read nothing from shared storage (a pool in another region has none): the
trainer puts the model's configuration and tokenizer files as one tar object named
`bundle` into the policy's Object Store bucket when it starts, and the weights follow as
version 0 through the weight-sync path. A rollout worker waits for the bundle (bounded),
unpacks it into a private directory and builds its engine from it.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError

from polyrl.api.naming import JobNames
from polyrl.workers.weightsync.store import ObjectMissing, WeightStore

BUNDLE = "bundle"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


class BundleMissing(RuntimeError):
    """No trainer has published the model bundle yet (or the bucket is gone)."""


def pack(model_dir: Path) -> bytes:
    """Every file of an HF directory except weights, as an uncompressed tar."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(model_dir.iterdir()):
            if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES):
                tar.add(path, arcname=path.name)
    return buffer.getvalue()


def unpack(blob: bytes, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(dest, filter="data")  # refuses absolute paths and links out of dest
    return dest


async def publish(js: JetStreamContext, names: JobNames, policy: str, model_dir: Path) -> int:
    store = await js.object_store(names.weights_bucket(policy))
    blob = pack(model_dir)
    await store.put(BUNDLE, blob)
    return len(blob)


async def publish_exported(
    js: JetStreamContext, names: JobNames, policy: str, export: Callable[[Path], object]
) -> int:
    """Publish the bundle of a model that `export` writes as an HF directory (a trainer's or
    a frozen policy's publisher's), from a scratch directory removed afterwards; its size."""
    scratch = Path(tempfile.mkdtemp(prefix="polyrl-bundle-"))
    try:
        await asyncio.to_thread(export, scratch)
        return await publish(js, names, policy, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def fetch(
    js: JetStreamContext,
    names: JobNames,
    policy: str,
    dest: Path,
    *,
    timeout: float = 300.0,
    poll: float = 0.5,
) -> Path:
    """Wait up to `timeout` seconds for the bundle, then unpack it into `dest`."""
    blob = await wait_for_object(js, names, policy, BUNDLE, timeout=timeout, poll=poll)
    if blob is None:
        raise BundleMissing(
            f"no model bundle for policy {policy!r} after {timeout:.0f}s: is its trainer running?"
        )
    return unpack(blob, dest)


async def wait_for_object(
    js: JetStreamContext, names: JobNames, policy: str, name: str, *, timeout: float, poll: float
) -> bytes | None:
    """Object `name` of `policy`'s bucket once its trainer has put it there, or None if it has
    not within `timeout` seconds (what a trainer publishes at its start: bundle, exam)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:  # WeightStore names its stream: nats-py's own get looks it up account-wide
            store = await WeightStore.open(js, names.weights_bucket(policy), bulk=False)
            return bytes(await store.get(name))
        except (ObjectMissing, ObjectNotFoundError, NotFoundError):
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(poll)
