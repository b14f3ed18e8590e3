"""Weight retention over a real nats-server: the trainer's pruning after each publication keeps
the weights bucket bounded for 300 versions, and a replica away for 100 versions catches up.

The trainer side is the real publisher and `retention` (what `trainer.Leader` runs after each
publication); a live replica heartbeats its version into the job's KV bucket as a rollout
worker does; a second replica stops heartbeating at version 10 and comes back at 110."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import APIError
from nats.js.kv import KeyValue
from tests.integration.workers.test_weight_sync import identical, trainer_versions, weights_only

from polyrl.api import natsconfig
from polyrl.api.messages import Heartbeat, PoolShare
from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.workers.weightsync import chain, retention
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.sync import WeightSync

pytestmark = pytest.mark.slow

POLICY, VERSIONS, EVERY, AWAY = "solver", 301, 20, (10, 110)
Job = tuple[JetStreamContext, JobNames]


@pytest.fixture
async def job(nats_server: NatsServer) -> AsyncIterator[Job]:
    """A fresh job's JetStream context and names; its streams and buckets go afterwards."""
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    names = JobNames(namespace="test", job=f"keep-{uuid.uuid4().hex[:8]}")
    try:
        yield js, names
    finally:
        await natsconfig.remove(js, names, [POLICY])
        await nc.close()


async def test_pruning_bounds_the_bucket_for_300_versions_and_an_absent_replica_catches_up(
    job: Job,
) -> None:
    js, names = job
    kv = await js.create_key_value(KeyValueConfig(bucket=names.heartbeats_bucket))
    store = await weights_only(js, names)
    versions = trainer_versions(VERSIONS, changed=0.05)
    publisher = WeightPublisher(store, names, POLICY, keyframe_every=EVERY)
    live, away = WeightSync(store), WeightSync(store)
    model_bytes = sum(t.numel() * 2 for t in versions[0].values())
    # The limit the trainer sets: publishing beyond it would fail, so the run shows it holds.
    limit = natsconfig.weights_bucket_messages(model_bytes, store.chunk_size, EVERY)
    await natsconfig.bound_weights(js, names, POLICY, limit)
    most = most_messages = 0
    try:
        for version, state in enumerate(versions):
            await publisher.publish(state)
            await live.to(version)
            await beat(kv, "live-0", version)
            if version <= AWAY[0]:
                await away.to(version)
                await beat(kv, "away-0", version)
            elif version == AWAY[0] + 1:
                await kv.delete(JobNames.heartbeat_key(POLICY, "rollout", "away-0"))
            await retention.prune(publisher, await retention.live_versions(kv, POLICY))
            held = [chain.parse(n, s) for n, s in (await store.sizes()).items()]
            keyframes = sorted(o.version for o in held if o is not None and o.is_keyframe)
            assert len(keyframes) <= 2, (version, keyframes)
            oldest = keyframes[0]
            assert all(o is not None and o.version >= oldest for o in held), version
            most = max(most, len(held))
            info = await js.stream_info(f"OBJ_{names.weights_bucket(POLICY)}")
            most_messages = max(most_messages, info.state.messages)
            if version == AWAY[1]:
                report = await away.to(version)  # back after 100 versions
                assert report.applied[0] == chain.keyframe_name(version - version % EVERY)
                assert identical(away.state, versions[version])
        assert identical(live.state, versions[-1])
        # Two keyframes, the deltas from the older to the latest, one in flight: 2 + 2*20 + 1.
        assert most <= 2 + 2 * EVERY + 1, most
        print(f"bucket: at most {most} objects, {most_messages} messages of {limit} allowed")
        assert most_messages <= limit
    finally:
        await store.close()


async def beat(kv: KeyValue, pod: str, version: int) -> None:
    heartbeat = Heartbeat(
        pod=pod, role="rollout", policy=POLICY, weight_version=version, at=time.time()
    )
    await kv.put(
        JobNames.heartbeat_key(POLICY, "rollout", pod), heartbeat.model_dump_json().encode()
    )


async def test_a_full_weights_bucket_refuses_a_publish_and_keeps_its_bound(job: Job) -> None:
    js, names = job
    store = await weights_only(js, names)
    versions = trainer_versions(3, changed=0.05)
    publisher = WeightPublisher(store, names, POLICY, keyframe_every=EVERY)
    try:
        await natsconfig.bound_weights(js, names, POLICY, 4)  # fewer than a keyframe's 6 chunks
        with pytest.raises(APIError) as refused:
            await publisher.publish(versions[0])
        assert natsconfig.is_full(refused.value)
        # Whoever ensures the job's streams later finds the bucket as its trainer bounded it.
        await natsconfig.ensure(js, names, [POLICY])
        info = await js.stream_info(f"OBJ_{names.weights_bucket(POLICY)}")
        assert info.config.max_msgs == 4
    finally:
        await store.close()


async def test_a_full_request_queue_refuses_new_requests_and_keeps_the_waiting_ones(
    job: Job,
) -> None:
    js, names = job
    (requests,) = [
        c for c in natsconfig.streams(names, [POLICY]) if c.name == names.requests_stream(POLICY)
    ]
    assert (requests.max_msgs, requests.max_age) == (
        natsconfig.REQUEST_CAP, natsconfig.REQUEST_MAX_AGE,
    )  # fmt: skip
    requests.max_msgs = 3  # the real config, at a size a test can fill
    await js.add_stream(requests)
    subject = names.requests_subject(POLICY)
    try:
        for i in range(3):
            await js.publish(subject, f"r{i}".encode())
        with pytest.raises(APIError) as refused:
            await js.publish(subject, b"r3")
        assert natsconfig.is_full(refused.value)
        sub = await js.pull_subscribe(subject, durable="rollout", stream=requests.name)
        assert [m.data for m in await sub.fetch(3, timeout=2)] == [b"r0", b"r1", b"r2"]
    finally:
        await js.delete_stream(requests.name or "")


async def test_a_policy_served_by_another_policys_pool_counts_the_pools_replicas_as_live(
    job: Job,
) -> None:
    """A shared pool's heartbeats are filed under the serving policy and carry each served
    policy's version (`Heartbeat.pool`): the served policy's trainer must keep what they
    serve, and a policy the pool does not serve sees none of it."""
    js, names = job
    kv = await js.create_key_value(KeyValueConfig(bucket=names.heartbeats_bucket))
    beats = {
        "solver.rollout.pool-0": Heartbeat(
            pod="pool-0", role="rollout", policy="solver", weight_version=7, at=time.time(),
            pool={"solver": PoolShare(weight_version=7), "verifier": PoolShare(weight_version=3)},
        ),
        "judge.rollout.judge-0": Heartbeat(
            pod="judge-0", role="rollout", policy="judge", weight_version=5, at=time.time()
        ),
    }  # fmt: skip
    for key, beat in beats.items():
        await kv.put(key, beat.model_dump_json().encode())
    assert await retention.live_versions(kv, "verifier") == {3}
    assert await retention.live_versions(kv, "solver") == {7}
    assert await retention.live_versions(kv, "judge") == {5}
    assert await retention.live_versions(kv, "critic") == set()
