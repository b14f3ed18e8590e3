"""The shaped proxy adds its round trip and caps the rate, and NATS works through it unchanged."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import nats
from nats.aio.msg import Msg
from nats.js import api

from polyrl.bench.netshape import ShapedProxy
from polyrl.local.natsserver import NatsServer
from polyrl.workers.weightsync.store import WeightStore

RATE_BITS, RTT = 40e6, 0.05  # 5 MB/s, 50 ms


async def test_a_round_trip_takes_the_rtt_and_bytes_take_their_time_on_the_link(
    nats_server: NatsServer,
) -> None:
    async with ShapedProxy("127.0.0.1", nats_server.port, rate_bits=RATE_BITS, rtt=RTT) as proxy:
        nc = await nats.connect(proxy.url)
        try:
            started = time.perf_counter()
            await nc.flush()  # PING, PONG
            assert RTT <= time.perf_counter() - started < RTT + 0.5

            js = nc.jetstream()
            bucket = f"shaped-{uuid.uuid4().hex[:8]}"
            await js.create_object_store(bucket, config=api.ObjectStoreConfig(bucket=bucket))
            store = await WeightStore.open(js, bucket)
            blob = os.urandom(1 << 20)
            await store.put("obj", blob)
            started = time.perf_counter()
            assert await store.get("obj") == blob  # through the bulk connection, also proxied
            elapsed = time.perf_counter() - started
            assert elapsed >= len(blob) / (RATE_BITS / 8) + RTT
            await store.close()
            await js.delete_object_store(bucket)
        finally:
            await nc.close()


async def test_a_cut_link_holds_every_byte_and_new_connections_until_it_heals(
    nats_server: NatsServer,
) -> None:
    async with ShapedProxy("127.0.0.1", nats_server.port, rate_bits=RATE_BITS, rtt=0.0) as proxy:
        nc = await nats.connect(proxy.url)
        try:
            received: list[bytes] = []

            async def keep(msg: Msg) -> None:
                received.append(msg.data)

            sub = await nc.subscribe("cut.test", cb=keep)
            await nc.flush()
            proxy.cut()
            await nc.publish("cut.test", b"held")
            late = asyncio.create_task(nats.connect(proxy.url, connect_timeout=10))
            await asyncio.sleep(1.5)
            # nothing crossed, and neither side was told anything
            assert received == []
            assert not late.done()
            assert nc.is_connected
            proxy.heal()
            await nc.flush(timeout=5)
            assert received == [b"held"]  # delivered once, in order, after the heal
            second = await asyncio.wait_for(late, 10)
            await second.close()
            await sub.unsubscribe()
        finally:
            await nc.close()
