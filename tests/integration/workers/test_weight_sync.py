"""A fake trainer publishes weight versions over a real nats-server; replicas catch up, bit for bit.

The trainer changes a quarter of a small bf16 state dict's elements per version and writes a
keyframe every 5 versions, so a delta costs about a fifth of a keyframe: a replica three versions
behind applies the chain, one ten behind jumps to the keyframe.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import nats
import pytest
import torch
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig

from polyrl.api import natsconfig
from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.workers.weightsync import announce
from polyrl.workers.weightsync.chain import delta_name, keyframe_name
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.store import WeightStore
from polyrl.workers.weightsync.sync import SyncFailed, WeightSync

POLICY = "solver"
LATEST = 12
State = dict[str, torch.Tensor]


def trainer_versions(count: int, seed: int = 0, changed: float = 0.25) -> list[State]:
    """Consecutive published bf16 states: `changed` of the elements move by a small step."""
    generator = torch.Generator().manual_seed(seed)
    shapes = {"embed.weight": (96, 64), "layers.0.mlp.weight": (64, 64), "norm.weight": (64,)}
    state = {
        name: torch.randn(shape, generator=generator).to(torch.bfloat16)
        for name, shape in shapes.items()
    }
    versions = [state]
    for _ in range(count - 1):
        state = {name: t.clone() for name, t in state.items()}
        for tensor in state.values():
            mask = torch.rand(tensor.shape, generator=generator) < changed
            step = torch.randn(tensor.shape, generator=generator) * 0.01
            tensor += (step * mask).to(torch.bfloat16)
        versions.append(state)
    return versions


def clone(state: State) -> State:
    return {name: tensor.clone() for name, tensor in state.items()}


def identical(a: State | None, b: State) -> bool:
    assert a is not None
    return a.keys() == b.keys() and all(
        torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in b
    )


class Job:
    def __init__(
        self, nc: Client, store: WeightStore, names: JobNames, versions: list[State]
    ) -> None:
        self.nc, self.store, self.names, self.versions = nc, store, names, versions

    def replica(self, version: int | None) -> WeightSync:
        if version is None:
            return WeightSync(self.store)
        return WeightSync(self.store, state=clone(self.versions[version]), version=version, epoch=0)


async def weights_only(js: JetStreamContext, names: JobNames) -> WeightStore:
    """Only the weights stream and bucket of the job (`ensure` would reserve the
    trajectories' 8 GiB of the test server's store for every test), and the bucket's store."""
    weights = [
        c for c in natsconfig.streams(names, [POLICY]) if c.name == names.weights_stream(POLICY)
    ]
    await js.add_stream(weights[0])
    bucket = names.weights_bucket(POLICY)
    await js.create_object_store(bucket, config=ObjectStoreConfig(bucket=bucket))
    return await WeightStore.open(js, bucket, chunk_bytes=4096)


@pytest.fixture
async def job(nats_server: NatsServer) -> AsyncIterator[Job]:
    """Versions 0..12 published with a keyframe every 5, into a fresh job's bucket."""
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    names = JobNames(namespace="test", job=f"sync-{uuid.uuid4().hex[:8]}")
    store = await weights_only(js, names)
    try:
        versions = trainer_versions(LATEST + 1)
        publisher = WeightPublisher(store, names, POLICY, keyframe_every=5)
        for state in versions:
            await publisher.publish(state)
        yield Job(nc, store, names, versions)
    finally:
        await store.close()
        await natsconfig.remove(js, names, [POLICY])
        await nc.close()


def deltas(first: int, last: int) -> list[str]:
    return [delta_name(v - 1, v) for v in range(first, last + 1)]


def changed_elements(a: State, b: State) -> int:
    return sum(int((a[k].view(torch.int16) != b[k].view(torch.int16)).sum()) for k in b)


async def test_a_replica_three_behind_applies_the_chain_bit_identically(job: Job) -> None:
    sync = job.replica(9)
    report = await sync.to(LATEST)
    assert report.applied == deltas(10, 12)
    assert (sync.version, sync.refusals) == (LATEST, 0)
    assert identical(sync.state, job.versions[LATEST])
    # What the report says the deltas rewrote is what changed between the versions, bit for bit.
    v = job.versions
    assert report.changed == sum(changed_elements(v[i - 1], v[i]) for i in range(10, 13))
    assert report.elements == 3 * sum(t.numel() for t in v[0].values())
    assert report.changed_fraction is not None
    assert 0.15 < report.changed_fraction < 0.3


async def test_a_replica_ten_behind_jumps_to_the_keyframe(job: Job) -> None:
    sync = job.replica(2)
    report = await sync.to(LATEST)
    assert report.applied == [keyframe_name(10), *deltas(11, 12)]
    assert identical(sync.state, job.versions[LATEST])


async def test_a_new_replica_starts_from_the_latest_keyframe(job: Job) -> None:
    sync = job.replica(None)
    report = await sync.to(LATEST)
    assert report.applied == [keyframe_name(10), *deltas(11, 12)]
    assert identical(sync.state, job.versions[LATEST])
    assert (await sync.to(LATEST)).applied == []
    keyframe_only = await job.replica(None).to(10)
    assert (keyframe_only.applied, keyframe_only.changed_fraction) == ([keyframe_name(10)], None)


async def test_the_latest_announcement_is_the_delta_and_following_it_skips_the_listing(
    job: Job,
) -> None:
    latest = await announce.latest(job.nc.jetstream(), job.names, POLICY)
    assert latest is not None
    assert (latest.version, latest.kind, latest.base_version) == (LATEST, "delta", LATEST - 1)
    assert latest.object == delta_name(LATEST - 1, LATEST)
    assert latest.checksum == (await job.store.meta(latest.object)).digest
    sync = job.replica(LATEST - 1)
    job.store.sizes = None  # type: ignore[assignment,method-assign]  # a listing would fail
    report = await sync.follow(latest)
    assert report.applied == [latest.object]
    assert identical(sync.state, job.versions[LATEST])


async def test_a_corrupt_delta_is_refused_and_the_replica_resyncs_from_the_keyframe(
    job: Job,
) -> None:
    name = delta_name(8, 9)
    blob = bytearray(await job.store.get(name))
    blob[-1] ^= 0x40
    await job.store.put(name, bytes(blob))  # a sound object holding a damaged delta
    sync = job.replica(8)
    report = await sync.to(LATEST)
    assert sync.refusals == 1
    assert report.refused == [name]
    assert "CorruptDelta" in (sync.last_refusal or "")
    assert report.applied == [keyframe_name(10), *deltas(11, 12)]
    assert identical(sync.state, job.versions[LATEST])


async def test_damaged_chunks_in_the_bucket_are_refused_and_the_replica_resyncs(job: Job) -> None:
    js = job.nc.jetstream()
    name = delta_name(9, 10)
    meta = await job.store.meta(name)
    blob = bytearray(await job.store.get(name))
    blob[100] ^= 1
    subject = f"$O.{job.store.bucket}.C.{meta.nuid}"
    await js.purge_stream(job.store.stream, subject=subject)
    for start in range(0, len(blob), 4096):
        await js.publish(subject, bytes(blob[start : start + 4096]))
    sync = job.replica(8)
    await sync.to(LATEST)
    assert sync.refusals == 1
    assert "ObjectCorrupt" in (sync.last_refusal or "")
    assert identical(sync.state, job.versions[LATEST])


async def test_a_replica_whose_weights_drifted_is_rolled_back_then_repaired_by_the_keyframe(
    job: Job,
) -> None:
    sync = job.replica(11)
    assert sync.state is not None
    sync.state["norm.weight"].view(torch.int16)[3] ^= 1  # not the bits it claims to hold
    await sync.to(LATEST)
    assert sync.refusals == 1
    assert "ChecksumMismatch" in (sync.last_refusal or "")
    assert identical(sync.state, job.versions[LATEST])


async def test_an_announced_object_that_was_deleted_is_refused_then_planned_around(
    job: Job,
) -> None:
    latest = await announce.latest(job.nc.jetstream(), job.names, POLICY)
    assert latest is not None
    await job.store.delete(latest.object)
    sync = job.replica(LATEST - 1)
    with pytest.raises(SyncFailed):  # 12 is only reachable through the deleted delta
        await sync.follow(latest)
    assert sync.refusals == 1
    assert "ObjectMissing" in (sync.last_refusal or "")
    assert sync.version == LATEST - 1  # untouched, still good weights of 11
    assert identical(sync.state, job.versions[LATEST - 1])


async def test_pruning_keeps_what_live_replicas_use(job: Job) -> None:
    publisher = WeightPublisher(job.store, job.names, POLICY, keyframe_every=5)
    deleted = await publisher.prune(live_versions={8}, keep_keyframes=1)
    assert keyframe_name(0) in deleted
    assert keyframe_name(5) in deleted
    assert delta_name(8, 9) not in deleted
    for have in (8, None):
        sync = job.replica(have)
        await sync.to(LATEST)
        assert identical(sync.state, job.versions[LATEST])


async def test_a_new_trainer_epoch_makes_replicas_start_from_its_keyframe(job: Job) -> None:
    restarted = trainer_versions(2, seed=7)
    publisher = WeightPublisher(job.store, job.names, POLICY, keyframe_every=5, epoch=1)
    await publisher.publish(restarted[0], version=LATEST + 1)
    announced = await publisher.publish(restarted[1])
    sync = job.replica(LATEST)
    report = await sync.follow(announced[-1])
    assert report.applied == [keyframe_name(LATEST + 1), delta_name(LATEST + 1, LATEST + 2)]
    assert (sync.version, sync.epoch, sync.refusals) == (LATEST + 2, 1, 0)
    assert identical(sync.state, restarted[1])
