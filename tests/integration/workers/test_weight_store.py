"""Weight objects in a real JetStream Object Store: our reader and writer, and the stock ones."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import DigestMismatchError

from polyrl.local.natsserver import NatsServer
from polyrl.workers.weightsync.store import ObjectCorrupt, ObjectMissing, WeightStore, digest_of

# Both read paths: the bulk connection, and nats-py (its fallback under TLS or nkeys).
PATHS = [pytest.param(True, id="bulk"), pytest.param(False, id="nats-py")]


@pytest.fixture
async def client(nats_server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server.url)
    yield nc
    await nc.close()


@pytest.fixture
async def new_store() -> AsyncIterator[StoreFactory]:
    """A store on a fresh bucket, with 1000-byte chunks and 3 chunks per pull request."""
    made: list[WeightStore] = []

    async def make(js: JetStreamContext, bulk: bool = True, chunk_bytes: int = 1000) -> WeightStore:
        bucket = f"weights-{uuid.uuid4().hex[:8]}"
        await js.create_object_store(bucket, config=api.ObjectStoreConfig(bucket=bucket))
        store = await WeightStore.open(js, bucket, bulk=bulk, chunk_bytes=chunk_bytes)
        store.pull_bytes = 3 * chunk_bytes  # several pull requests per object
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()
        await store.js.delete_object_store(store.bucket)


StoreFactory = Callable[..., Awaitable[WeightStore]]


@pytest.mark.parametrize("bulk", PATHS)
@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 25_000])
async def test_an_object_reads_back_as_written_at_every_size_around_chunk_edges(
    client: Client, new_store: StoreFactory, bulk: bool, size: int
) -> None:
    store = await new_store(client.jetstream(), bulk)
    blob = os.urandom(size)
    meta = await store.put("v000000000001.key", blob)
    assert (meta.size, meta.chunks) == (size, -(-size // 1000))
    assert await store.get("v000000000001.key") == blob


async def test_large_chunks_follow_the_servers_max_payload(
    client: Client, new_store: StoreFactory
) -> None:
    store = await new_store(client.jetstream(), chunk_bytes=64 << 20)
    blob = os.urandom((8 << 20) + 5)
    meta = await store.put("big", blob)
    assert meta.chunks == 2  # 8 MiB chunks: the test server's max_payload
    assert await store.get("big") == blob


@pytest.mark.parametrize("bulk", PATHS)
async def test_what_we_write_the_stock_client_reads_and_what_it_writes_we_read(
    client: Client, new_store: StoreFactory, bulk: bool
) -> None:
    js = client.jetstream()
    store = await new_store(js, bulk)
    ours, theirs = os.urandom(40_000), os.urandom(300_000)  # theirs: stock 128 KiB chunks
    await store.put("ours", ours)
    assert (await store.objects.get("ours")).data == ours
    await store.objects.put("theirs", theirs)
    assert await store.get("theirs") == theirs
    assert (await store.objects.get_info("ours")).digest == digest_of(ours)
    assert await store.sizes() == {"ours": 40_000, "theirs": 300_000}


@pytest.mark.parametrize("bulk", PATHS)
async def test_a_missing_or_deleted_object_is_object_missing(
    client: Client, new_store: StoreFactory, bulk: bool
) -> None:
    store = await new_store(client.jetstream(), bulk)
    with pytest.raises(ObjectMissing):
        await store.get("never-written")
    await store.put("gone", b"x" * 5000)
    await store.delete("gone")
    with pytest.raises(ObjectMissing):
        await store.get("gone")
    assert await store.sizes() == {}


async def test_rewriting_a_name_replaces_the_object_and_drops_the_old_chunks(
    client: Client,
    new_store: StoreFactory,
) -> None:
    js = client.jetstream()
    store = await new_store(js)
    first = await store.put("same", os.urandom(5000))
    await store.put("same", b"second")
    assert bytes(await store.get("same")) == b"second"
    stream = await js.stream_info(store.stream, subjects_filter=f"$O.{store.bucket}.C.>")
    assert f"$O.{store.bucket}.C.{first.nuid}" not in (stream.state.subjects or {})


async def republish_chunks(
    js: JetStreamContext, store: WeightStore, name: str, chunks: list[bytes]
) -> None:
    """Replace an object's chunks behind its metadata's back (a damaged store)."""
    meta = await store.meta(name)
    subject = f"$O.{store.bucket}.C.{meta.nuid}"
    await js.purge_stream(store.stream, subject=subject)
    for chunk in chunks:
        await js.publish(subject, chunk)


@pytest.mark.parametrize("bulk", PATHS)
async def test_a_flipped_byte_is_a_digest_mismatch(
    client: Client, new_store: StoreFactory, bulk: bool
) -> None:
    js = client.jetstream()
    store = await new_store(js, bulk)
    blob = bytearray(os.urandom(5000))
    await store.put("obj", bytes(blob))
    blob[4321] ^= 1
    await republish_chunks(
        js, store, "obj", [bytes(blob[i : i + 1000]) for i in range(0, 5000, 1000)]
    )
    with pytest.raises(ObjectCorrupt, match="digest"):
        await store.get("obj")
    with pytest.raises(DigestMismatchError):  # the stock reader agrees
        await store.objects.get("obj")


@pytest.mark.parametrize("bulk", PATHS)
async def test_missing_or_extra_chunks_are_corrupt_not_a_hang(
    client: Client, new_store: StoreFactory, bulk: bool
) -> None:
    js = client.jetstream()
    store = await new_store(js, bulk)
    blob = os.urandom(5000)
    await store.put("short", blob)
    await republish_chunks(js, store, "short", [blob[:1000], blob[1000:2000]])
    with pytest.raises(ObjectCorrupt, match="ended after"):
        await store.get("short")
    await store.put("long", blob)
    await republish_chunks(
        js, store, "long", [blob[i : i + 1000] for i in range(0, 5000, 1000)] + [b"extra"]
    )
    with pytest.raises(ObjectCorrupt, match="more chunks"):
        await store.get("long")
    await store.put("thin", blob)
    chunks = [blob[i : i + 1000] for i in range(0, 5000, 1000)]
    await republish_chunks(js, store, "thin", [*chunks[:4], chunks[4][:-1]])
    with pytest.raises(ObjectCorrupt, match="not 5000"):
        await store.get("thin")


async def test_metadata_with_another_digest_is_corrupt(
    client: Client, new_store: StoreFactory
) -> None:
    js = client.jetstream()
    store = await new_store(js)
    await store.put("obj", b"payload" * 100)
    info = await store.objects.get_info("obj")
    info.digest = digest_of(b"something else")
    subject = f"$O.{store.bucket}.M.{base64.urlsafe_b64encode(b'obj').decode()}"
    await js.publish(subject, json.dumps(info.as_dict()).encode(), headers={"Nats-Rollup": "sub"})
    with pytest.raises(ObjectCorrupt, match="digest"):
        await store.get("obj")


async def test_concurrent_reads_share_one_bulk_connection(
    client: Client, new_store: StoreFactory
) -> None:
    store = await new_store(client.jetstream())
    blobs = {f"o{i}": os.urandom(7000 + i) for i in range(4)}
    for name, blob in blobs.items():
        await store.put(name, blob)
    got = await asyncio.gather(*(store.get(name) for name in blobs))
    assert got == list(blobs.values())


async def test_a_bulk_connection_lost_mid_read_falls_back_to_nats_py(
    client: Client, new_store: StoreFactory
) -> None:
    store = await new_store(client.jetstream())
    blob = os.urandom(50_000)
    await store.put("obj", blob)
    connection = await store._bulk_connection()
    assert connection is not None
    transport = connection._transport
    assert transport is not None
    original = connection.inbox

    def inbox_then_break(sink: Any, consumer: str) -> str:
        subject = original(sink, consumer)
        asyncio.get_running_loop().call_soon(transport.abort)
        return subject

    connection.inbox = inbox_then_break  # type: ignore[method-assign]
    reads: list[bool] = []
    read = store._read

    async def recording_read(meta: Any, *, bulk: bool) -> Any:
        reads.append(bulk)
        return await read(meta, bulk=bulk)

    store._read = recording_read  # type: ignore[method-assign]
    assert await store.get("obj") == blob
    assert reads == [True, False]
    assert not connection.usable
    assert await store.get("obj") == blob  # a new bulk connection
    assert store._bulk is not connection
