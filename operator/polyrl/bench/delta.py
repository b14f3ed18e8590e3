"""`polyrl bench delta`: what sparse weight deltas save, and what moving them costs, in one run.

Every figure is measured against a baseline in the same run, since the machines are shared:

1. Size, on real deltas: a tiny Llama trained at lr 1e-6 and 1e-5 (`measure.training_deltas`);
   per step, our delta against a full bf16 copy (2 bytes per element) and COO (6 bytes per changed
   element), and bytes per changed element; the median over steps 2-20 (2-6 with --quick).
   Headline keys are lr 1e-6, `_lr1e5` keys the other.
2. Speed, on a synthetic bf16 model of 512 MiB (32 MiB with --quick) with 1% of the elements
   changed (`measure.synthetic_speed`): encode, and apply with verification, against
   `dst.copy_(src)` of the same tensors. And what encoding adds to a training step of the tiny
   model that it runs beside, as the trainer runs it (`measure.encode_overhead`): in a child
   process (`encode_share_of_step`), and for comparison on a thread (`_thread`).
3. Transport, through a nats-server started here: the keyframe of that model read by
   `WeightStore.get` (digest checked) against a plain nats-py pull consumer that only collects the
   same chunks (`objstore_vs_pull`, higher is better), and by the stock `ObjectStore.get`.
4. End-to-end sync of a replica, new (keyframe) against one version behind (delta), each from the
   announcement to weights verified in its state dict: on loopback, and through `netshape`'s
   proxy at 200 Mbit/s and 100 ms round trip (a replica in another region).

With `--model DIR`, the figures of 1 and 4 come from RL steps of that model instead
(`delta_model`).

Progress goes to stderr; the figures are returned (stdout is the CLI's).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import nats
import torch
from nats.aio.client import Client
from nats.js import JetStreamContext, api

from polyrl.api import natsconfig
from polyrl.api.naming import JobNames
from polyrl.bench import delta_model, measure
from polyrl.bench.netshape import ShapedProxy
from polyrl.local.natsserver import NatsServer
from polyrl.workers.deltas.encoders.inline import InlineEncoder
from polyrl.workers.deltas.encoders.process import ProcessEncoder
from polyrl.workers.runtime import worker as runtime
from polyrl.workers.weightsync.announce import WeightAnnouncement
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.store import ObjectMeta, WeightStore
from polyrl.workers.weightsync.sync import WeightSync

POLICY = "bench"
LEARNING_RATES = {"": 1e-6, "_lr1e5": 1e-5}
CHANGE_RATE = 0.01
SHAPED_RATE_BITS = 200e6
SHAPED_RTT = 0.1
SHAPED_LINK = f"{SHAPED_RATE_BITS / 1e6:.0f} Mbit/s, {SHAPED_RTT * 1e3:.0f} ms RTT"
State = dict[str, torch.Tensor]


def run(*, quick: bool, model: Path | None = None) -> dict[str, Any]:
    if model is not None:
        return model_figures(model, quick=quick)
    steps, mib, repeats = (6, 32, 2) if quick else (20, 512, 5)
    figures: dict[str, Any] = {"quick": quick, "threads": torch.get_num_threads()}
    for suffix, lr in LEARNING_RATES.items():
        _progress(f"training deltas at lr {lr}")
        figures.update(_with_suffix(training_figures(lr, steps), suffix))
    _progress("encoding beside a training step")
    # As the trainer runs: its torch thread count (`runtime.torch_threads`) and its encoder (a
    # child process); for comparison, encoding on a thread, and torch's default pool of every core.
    trainer_threads = runtime.torch_threads()
    lr, many = LEARNING_RATES[""], 3 * steps
    with contextlib.closing(ProcessEncoder()) as child:  # one child for the three
        overhead = measure.encode_overhead(child, steps=many, train_threads=trainer_threads, lr=lr)
        crowded = measure.encode_overhead(child, steps=many, lr=lr)
        dense = measure.encode_overhead(child, steps=many, train_threads=trainer_threads, lr=1e-5)
    threaded = measure.encode_overhead(
        InlineEncoder(), steps=many, train_threads=trainer_threads, lr=lr
    )
    figures |= {
        "train_step_s": overhead["step_s"],
        "train_step_threads": int(overhead["train_threads"]),
        "train_step_encode_s": overhead["encode_s"],
        "encode_share_of_step": overhead["overhead"],
        "encode_share_of_step_thread": threaded["overhead"],
        "encode_share_of_step_all_threads": crowded["overhead"],
        "encode_share_of_step_lr1e5": dense["overhead"],
        "train_step_all_threads_s": crowded["step_s"],
    }
    _progress(f"encode and apply, {mib} MiB synthetic model")
    figures.update(speed_figures(mib, repeats))
    with NatsServer() as server:
        figures.update(asyncio.run(transport_figures(server.url, mib, repeats=3)))
    return figures


def model_figures(model: Path, *, quick: bool) -> dict[str, Any]:
    """RL steps of a real model (`delta_model`), and its last delta synced to a replica."""
    figures, old, new = delta_model.steps_figures(
        model, steps=3 if quick else 6, progress=_progress
    )
    with NatsServer() as server:
        sync = asyncio.run(transport_figures(server.url, 0, repeats=1, states=(old, new)))
    keep = ("publish_keyframe_and_delta_s", "keyframe_bytes", "delta_bytes", "shaped_link")
    return figures | {k: v for k, v in sync.items() if k in keep or "sync" in k}


def training_figures(lr: float, steps: int) -> dict[str, Any]:
    """Medians over steps 2..`steps` of our delta's size against full bf16 and COO."""
    result = measure.training_deltas(lr, steps=steps)
    params = result["model"]["params"]
    later = [step for step in result["steps"][1:] if step["changed"]]
    return {
        "changed_fraction": statistics.median(s["changed_fraction"] for s in later),
        "bytes_per_changed_element": statistics.median(s["bytes_per_changed"] for s in later),
        "ratio_vs_full": statistics.median(2 * params / s["bytes"] for s in later),
        "ratio_vs_coo": statistics.median(
            measure.COO_BYTES * s["changed"] / s["bytes"] for s in later
        ),
        "training_steps": f"2-{steps}",
        "training_bit_identical": all(s["bit_identical"] for s in result["steps"]),
        "training_params": params,
    }


def speed_figures(mib: int, repeats: int) -> dict[str, Any]:
    result = measure.synthetic_speed(total_mib=mib, change_rate=CHANGE_RATE, repeats=repeats)
    return {
        "synthetic_mib": mib,
        "synthetic_changed_fraction": CHANGE_RATE,
        "synthetic_bytes_per_changed_element": result["bytes_per_changed"],
        "copy_s": result["copy_s"],
        "encode_s": result["encode_s"],
        "apply_s": result["apply_s"],
        "encode_vs_copy": result["encode_vs_copy"],
        "apply_vs_copy": result["apply_vs_copy"],
    }


async def transport_figures(
    url: str, mib: int, repeats: int, states: tuple[State, State] | None = None
) -> dict[str, Any]:
    """Publication, reads and syncs of `states` (old, new), by default a synthetic model
    of `mib` MiB with `CHANGE_RATE` of its elements changed."""
    old, new = states or measure._synthetic_states(mib, CHANGE_RATE, 16)
    nc = await nats.connect(url)
    js = nc.jetstream()
    names = JobNames(namespace="bench", job=f"delta-{uuid.uuid4().hex[:6]}")
    store = await _bucket(js, names)
    try:
        _progress("publishing a keyframe and a delta")
        publisher = WeightPublisher(store, names, POLICY, keyframe_every=1)
        await publisher.publish(old)
        started = time.perf_counter()
        keyframe, delta = await publisher.publish(new)  # keyframe 1, then delta 0 -> 1
        figures: dict[str, Any] = {
            "publish_keyframe_and_delta_s": time.perf_counter() - started,
            "keyframe_bytes": keyframe.size,
            "delta_bytes": delta.size,
        }
        _progress("object store reads")
        figures.update(await read_figures(store, await store.meta(keyframe.object), repeats))
        _progress("sync on loopback")
        figures.update(await sync_figures(store, old, new, delta, "sync"))
        _progress(f"sync through {SHAPED_LINK}")
        figures.update(await shaped_figures(nc, store, old, new, delta))
        return figures
    finally:
        await store.close()
        await natsconfig.remove(js, names, [POLICY])
        await nc.close()


async def shaped_figures(
    nc: Client, store: WeightStore, old: State, new: State, delta: WeightAnnouncement
) -> dict[str, Any]:
    """The same syncs by a replica whose connection goes through the shaped proxy."""
    server = nc.connected_url
    assert server is not None
    assert server.hostname is not None
    link = ShapedProxy(
        server.hostname, server.port or 4222, rate_bits=SHAPED_RATE_BITS, rtt=SHAPED_RTT
    )
    async with link as proxy:
        remote = await nats.connect(proxy.url)
        far = await WeightStore.open(remote.jetstream(), store.bucket)
        try:
            figures = await sync_figures(far, old, new, delta, "shaped_sync", runs=1)
        finally:
            await far.close()
            await remote.close()
    return {**figures, "shaped_link": SHAPED_LINK}


async def read_figures(store: WeightStore, meta: ObjectMeta, repeats: int) -> dict[str, Any]:
    """Best of `repeats`, interleaved, so a busy machine slows both readers alike."""
    ours = plain = math.inf
    for _ in range(repeats):
        plain = min(plain, await _timed(plain_pull(store, meta)))
        ours = min(ours, await _timed(store.get(meta.name)))
    stock = await _timed(store.objects.get(meta.name))
    mb = meta.size / 1e6
    return {
        "objstore_bytes": meta.size,
        "objstore_mb_s": mb / ours,
        "plain_pull_mb_s": mb / plain,
        "stock_get_mb_s": mb / stock,
        "objstore_vs_pull": plain / ours,
        "objstore_vs_stock_get": stock / ours,
    }


async def plain_pull(store: WeightStore, meta: ObjectMeta, batch: int = 4) -> list[bytes]:
    """The baseline: a nats-py pull consumer that fetches the object's chunks and keeps them."""
    sub = await store.js.pull_subscribe(
        f"$O.{store.bucket}.C.{meta.nuid}",
        stream=store.stream,
        config=api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.ALL
        ),
    )
    chunks: list[bytes] = []
    try:
        while len(chunks) < meta.chunks:
            msgs = await sub.fetch(min(batch, meta.chunks - len(chunks)), timeout=30)
            chunks += [msg.data for msg in msgs]
    finally:
        await sub.unsubscribe()
    if sum(len(chunk) for chunk in chunks) != meta.size:
        raise AssertionError("the plain pull read another object")
    return chunks


async def sync_figures(
    store: WeightStore,
    old: State,
    new: State,
    delta: WeightAnnouncement,
    prefix: str,
    runs: int = 2,
) -> dict[str, Any]:
    """A new replica (keyframe) and one a version behind (the delta), best of `runs`."""
    full = behind = math.inf
    for _ in range(runs):
        fresh = WeightSync(store)
        full = min(full, await _timed(fresh.to(delta.version, epoch=delta.epoch)))
        _check(fresh, new)
        state = {name: tensor.clone() for name, tensor in old.items()}
        replica = WeightSync(store, state=state, version=delta.base_version, epoch=delta.epoch)
        behind = min(behind, await _timed(replica.follow(delta)))
        _check(replica, new)
        del fresh, replica, state  # the next run allocates afresh, like a new replica
    return {
        f"{prefix}_full_s": full,
        f"{prefix}_delta_s": behind,
        f"{prefix}_full_vs_delta": full / behind,
    }


def _check(sync: WeightSync, expected: State) -> None:
    state = sync.state
    if (
        state is None
        or sync.refusals
        or not all(
            torch.equal(state[k].view(torch.int16), expected[k].view(torch.int16)) for k in expected
        )
    ):
        raise AssertionError("the synced replica's weights differ from the trainer's")


async def _bucket(js: JetStreamContext, names: JobNames) -> WeightStore:
    """The job's weights stream and bucket only (not its trajectory and request streams)."""
    for stream in natsconfig.streams(names, [POLICY]):
        if stream.name == names.weights_stream(POLICY):
            await js.add_stream(stream)
    bucket = names.weights_bucket(POLICY)
    config = api.ObjectStoreConfig(bucket=bucket, storage=api.StorageType.FILE)
    await js.create_object_store(bucket, config=config)
    return await WeightStore.open(js, bucket)


async def _timed(work: Awaitable[object]) -> float:
    started = time.perf_counter()
    await work
    return time.perf_counter() - started


def _with_suffix(figures: dict[str, Any], suffix: str) -> dict[str, Any]:
    return {f"{key}{suffix}": value for key, value in figures.items()}


_STARTED = time.monotonic()


def _progress(message: str) -> None:
    elapsed = time.monotonic() - _STARTED
    print(f"[bench delta {elapsed:5.1f}s] {message}", file=sys.stderr, flush=True)
