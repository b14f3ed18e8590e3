"""Weight versions published in parts, one per rank of a sharded trainer, over a real nats-server.

Three ranks each encode their rows of every tensor (`shard_publish.ShardParts`, as FSDP2 shards
dim 0: uneven where the rows do not divide, a tensor not sharded carried by rank 0 alone);
replicas put the parts back together, bit for bit what a data-parallel trainer publishes for
the same weights, whether they follow every delta or start from the latest keyframe. A
damaged part is refused before any part applies; weights found drifted under one part, after
its siblings applied, leave the version unknown and cost a resync from a keyframe.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import nats
import pytest
import torch

from polyrl.api import natsconfig
from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.workers.trainer.shard_publish import ShardParts
from polyrl.workers.weightsync import announce, chain
from polyrl.workers.weightsync.chain import delta_name, keyframe_name
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.store import WeightStore
from polyrl.workers.weightsync.sync import WeightSync

from .test_weight_sync import POLICY, State, identical, trainer_versions, weights_only

RANKS, LATEST, EVERY = 3, 12, 5


def rows_of(state: State, rank: int) -> State:
    """What `rank` of RANKS holds of `state`: `torch.chunk`'s rows of dim 0, as FSDP2's
    Shard(0); the one-dimensional norm stays whole, on rank 0 (a tensor not sharded)."""
    out = {}
    for name, tensor in state.items():
        if name == "norm.weight":
            if rank == 0:
                out[name] = tensor.clone()
            continue
        chunks = tensor.chunk(RANKS)
        if rank < len(chunks):
            out[name] = chunks[rank].clone()
    return out


async def publish_in_parts(publisher: WeightPublisher, versions: list[State]) -> None:
    """Each version's parts, each rank's written in turn, each object announced once."""
    ranks = [ShardParts(keyframe_every=EVERY) for _ in range(RANKS)]
    for version, state in enumerate(versions):
        encoded = [parts.encode(rows_of(state, r), version) for r, parts in enumerate(ranks)]
        for j, part in enumerate(encoded[0]):
            metas = [
                await publisher.put_part(part.name, r, RANKS, encoded[r][j].blob)
                for r in range(RANKS)
            ]
            await publisher.announce_parts(version, part.name, part.kind, part.base, metas)


class Parted:
    def __init__(self, store: WeightStore, names: JobNames, versions: list[State]) -> None:
        self.store, self.names, self.versions = store, names, versions


@pytest.fixture
async def parted(nats_server: NatsServer) -> AsyncIterator[Parted]:
    """Versions 0..12 in parts, with a keyframe every 5, into a fresh job's bucket."""
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    names = JobNames(namespace="test", job=f"parts-{uuid.uuid4().hex[:8]}")
    await (await weights_only(js, names)).close()
    # Small chunks: every part is many messages, read through the bulk connection.
    store = await WeightStore.open(js, names.weights_bucket(POLICY), chunk_bytes=512)
    try:
        versions = trainer_versions(LATEST + 1)
        versions = [s | {"embed.weight": s["embed.weight"][:95]} for s in versions]  # 95 rows
        await publish_in_parts(WeightPublisher(store, names, POLICY, keyframe_every=5), versions)
        yield Parted(store, names, versions)
    finally:
        await store.close()
        await natsconfig.remove(js, names, [POLICY])
        await nc.close()


async def test_replicas_put_the_parts_together_bit_for_bit_by_chain_or_keyframe(
    parted: Parted,
) -> None:
    listing = await parted.store.sizes()
    assert chain.part_name(keyframe_name(10), 2, RANKS) in listing
    assert delta_name(11, 12) not in listing  # only its parts are stored
    fresh = WeightSync(parted.store)
    report = await fresh.to(LATEST)
    assert report.applied == [keyframe_name(10), delta_name(10, 11), delta_name(11, 12)]
    assert identical(fresh.state, parted.versions[LATEST])
    follower = WeightSync(parted.store)
    await follower.to(0)
    for version in range(1, LATEST + 1):
        report = await follower.to(version)
        assert report.applied == [delta_name(version - 1, version)]
        assert identical(follower.state, parted.versions[version]), version
    assert report.changed_fraction is not None
    assert 0.1 < report.changed_fraction < 0.4


async def test_the_announcement_names_the_parts_and_following_it_fetches_just_those(
    parted: Parted,
) -> None:
    js = parted.store.js
    latest = await announce.latest(js, parted.names, POLICY)
    assert latest is not None
    assert (latest.object, latest.parts) == (delta_name(11, 12), RANKS)
    assert len(latest.checksum.split(",")) == RANKS
    sizes = await parted.store.sizes()
    assert latest.size == sum(sizes[p] for p in chain.part_names(latest.object, RANKS))
    sync = WeightSync(parted.store)
    await sync.to(11, epoch=latest.epoch)
    report = await sync.follow(latest)
    assert report.applied == [delta_name(11, 12)]
    assert identical(sync.state, parted.versions[LATEST])


async def test_a_damaged_part_is_refused_before_any_of_its_siblings_applies(
    parted: Parted,
) -> None:
    name = chain.part_name(delta_name(8, 9), 2, RANKS)  # the last part: checked before the first
    blob = bytearray(await parted.store.get(name))
    blob[-1] ^= 0x40
    await parted.store.put(name, bytes(blob))
    sync = WeightSync(parted.store)
    await sync.to(8)
    report = await sync.to(LATEST)
    assert sync.refusals == 1
    assert "CorruptDelta" in (sync.last_refusal or "")
    assert report.refused == [delta_name(8, 9)]
    assert report.applied == [keyframe_name(10), delta_name(10, 11), delta_name(11, 12)]
    assert identical(sync.state, parted.versions[LATEST])


async def test_weights_drifted_under_one_part_are_rolled_back_to_an_unknown_version_and_repaired(
    parted: Parted,
) -> None:
    sync = WeightSync(parted.store)
    await sync.to(10)
    assert sync.state is not None
    last_rows = sync.state["layers.0.mlp.weight"][-1]  # in rank 2's part only
    last_rows.view(torch.int16)[0] ^= 1
    report = await sync.to(LATEST)
    assert sync.refusals == 1
    assert "ChecksumMismatch" in (sync.last_refusal or "")
    assert report.applied[0] == keyframe_name(10)  # parts 0 and 1 had applied: version unknown
    assert identical(sync.state, parted.versions[LATEST])
