"""Weight objects in a policy's JetStream Object Store bucket: large chunks in, a pull consumer out.

Weight objects are deltas of a few MB and keyframes of the whole model (hundreds of MB to GB),
written once by the trainer and read by every rollout replica, so the read path is the one that
matters. nats-py's `ObjectStore.get()` reaches 10-60 MB/s on such objects: it appends each chunk
to a growing `bytes` (quadratic in the object's size) through a push consumer. This module keeps
the bucket's layout exactly (meta message, chunk subject, SHA-256 digest), so stock clients in any
language read what we write and we read what they write, and changes only how the bytes move:

- `put` cuts the object into chunks as large as the server allows (`max_payload`, 8 MiB in our
  deployment, against the stock 128 KiB), publishes them with a window of asynchronous acks instead
  of a round trip each, and hashes the object on a thread meanwhile.
- `get` makes an ephemeral pull consumer on the object's chunk subject and keeps two pull requests
  in flight, so the server never waits for the client between batches (which matters at 100 ms
  round trips). Chunks land in one preallocated buffer, through `BulkConnection` where the
  server allows it (the payload is read from the socket straight into its place), else through
  nats-py with one copy. A single worker thread hashes each chunk once it has landed, overlapping
  the network. The buffer is returned only if the count, order, size and digest of the chunks match
  the object's metadata.

Errors: `ObjectMissing` (no such object, or deleted), `ObjectCorrupt` (digest, size or chunk
sequence differ from the metadata, or the chunks stopped coming). Both are `WeightObjectError`s.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import numpy as np
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.kv import MSG_ROLLUP_SUBJECT
from nats.js.object_store import ObjectStore

from polyrl.workers.deltas.format import Blob
from polyrl.workers.weightsync.bulk import BulkClosed, BulkConnection, BulkUnsupported

MAX_CHUNK = 8 << 20  # our servers' max_payload; smaller servers get max_payload-sized chunks
PULL_BYTES = 16 << 20  # asked for per pull request; two in flight stay under the server's
# 64 MiB per-client pending limit, past which it cuts a slow consumer off
PULLS_IN_FLIGHT = 2
PUBLISH_WINDOW = 64 << 20  # unacknowledged bytes while writing
DIGEST_PREFIX = "SHA-256="
_IDLE_HEARTBEAT = "100"

_Release = Callable[[], Awaitable[None]]


class WeightObjectError(Exception):
    """A weight object could not be read as written."""


class ObjectMissing(WeightObjectError, LookupError):
    """No such object in the bucket (never written, deleted, or removed by retention)."""


class ObjectCorrupt(WeightObjectError):
    """The chunks read do not match the object's metadata (digest, size, count or order)."""


class _ConnectionLost(WeightObjectError):
    """The bulk connection ended during a read: says nothing about the object."""


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What the bucket says about an object, enough to read and check it."""

    name: str
    nuid: str
    size: int
    chunks: int
    digest: str  # "SHA-256=<urlsafe base64>", as every NATS client writes it


def digest_of(blob: Blob) -> str:
    """The Object Store's digest string for `blob`."""
    return DIGEST_PREFIX + base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).decode()


class WeightStore:
    """Reads and writes the weight objects of one bucket.

    `bulk=False` reads through nats-py only (the fallback the bulk connection uses when the server
    wants TLS or signatures); `chunk_bytes` caps the chunk size below `max_payload` (tests).
    `close()` ends the bulk connection.
    """

    def __init__(
        self,
        js: JetStreamContext,
        objects: ObjectStore,
        bucket: str,
        *,
        bulk: bool = True,
        chunk_bytes: int = MAX_CHUNK,
    ) -> None:
        self.js = js
        self.objects = objects
        self.bucket = bucket
        self.stream = f"OBJ_{bucket}"
        self.timeout = 30.0  # longest silence while reading, in seconds
        self.use_bulk = bulk
        self.chunk_bytes = chunk_bytes
        self.pull_bytes = PULL_BYTES
        self._bulk: BulkConnection | None = None
        self._opening = asyncio.Lock()
        self._cleanup: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(
        cls, js: JetStreamContext, bucket: str, *, bulk: bool = True, chunk_bytes: int = MAX_CHUNK
    ) -> WeightStore:
        return cls(js, await js.object_store(bucket), bucket, bulk=bulk, chunk_bytes=chunk_bytes)

    async def close(self) -> None:
        if self._bulk is not None:
            self._bulk.close()
            self._bulk = None
        await asyncio.gather(*self._cleanup, return_exceptions=True)

    @property
    def chunk_size(self) -> int:
        return max(1, min(self.chunk_bytes, self.js._nc.max_payload))

    async def meta(self, name: str) -> ObjectMeta:
        try:
            info = await self.objects.get_info(name)
        except (ObjectNotFoundError, NotFoundError) as err:
            raise ObjectMissing(f"{self.bucket}/{name}: no such object") from err
        return ObjectMeta(name, info.nuid, info.size or 0, info.chunks or 0, info.digest or "")

    async def sizes(self) -> dict[str, int]:
        """Every live object's name and size (what `chain.plan_sync` plans over).

        From the last metadata message of each object, found through the stream's info:
        nats-py's `list` looks its stream up account-wide, which a worker's user may not.
        """
        meta = f"$O.{self.bucket}.M.>"
        info = await self.js.stream_info(self.stream, subjects_filter=meta)
        subjects = list((info.state.subjects or {}) if info.state else {})
        last = await asyncio.gather(*(self.js.get_last_msg(self.stream, s) for s in subjects))
        infos = [api.ObjectInfo.from_response(json.loads(msg.data or b"{}")) for msg in last]
        return {o.name: o.size or 0 for o in infos if not o.deleted}

    async def delete(self, name: str) -> None:
        try:
            await self.objects.delete(name)
        except (ObjectNotFoundError, NotFoundError) as err:
            raise ObjectMissing(f"{self.bucket}/{name}: no such object") from err

    async def put(self, name: str, blob: Blob) -> ObjectMeta:
        """Write `blob` under `name`, replacing any object of that name once it is complete."""
        try:
            old: ObjectMeta | None = await self.meta(name)
        except ObjectMissing:
            old = None
        nuid = self.js._nc._nuid.next().decode()
        subject = self._chunk_subject(nuid)
        digest = asyncio.create_task(asyncio.to_thread(digest_of, blob))
        try:
            chunks = await self._publish_chunks(subject, blob)
            meta = ObjectMeta(name, nuid, len(blob), chunks, await digest)
            await self._publish_meta(meta)
        except BaseException:
            digest.cancel()
            await self.js.purge_stream(self.stream, subject=subject)
            raise
        if old is not None:
            await self.js.purge_stream(self.stream, subject=self._chunk_subject(old.nuid))
        return meta

    async def _publish_chunks(self, subject: str, blob: Blob) -> int:
        size = self.chunk_size
        window = max(1, PUBLISH_WINDOW // size)
        pending: list[asyncio.Future[api.PubAck]] = []
        for start in range(0, len(blob), size):
            if len(pending) >= window:
                await pending.pop(0)
            chunk = bytes(blob[start : start + size])
            pending.append(await self.js.publish_async(subject, chunk))
        await asyncio.gather(*pending)
        return (len(blob) + size - 1) // size

    async def _publish_meta(self, meta: ObjectMeta) -> None:
        info = api.ObjectInfo(
            name=meta.name,
            bucket=self.bucket,
            nuid=meta.nuid,
            size=meta.size,
            chunks=meta.chunks,
            digest=meta.digest,
            mtime=datetime.now(UTC).isoformat(),
            options=api.ObjectMetaOptions(max_chunk_size=self.chunk_size),
        )
        encoded = base64.urlsafe_b64encode(meta.name.encode()).decode()
        await self.js.publish(
            f"$O.{self.bucket}.M.{encoded}",
            json.dumps(info.as_dict()).encode(),
            headers={api.Header.ROLLUP: MSG_ROLLUP_SUBJECT},
        )

    def _chunk_subject(self, nuid: str) -> str:
        return f"$O.{self.bucket}.C.{nuid}"

    async def get(self, name: str) -> memoryview:
        """The object's bytes, checked against its digest; `ObjectMissing`, `ObjectCorrupt`.
        One read at a time per store: two large objects read side by side through the bulk
        connection have lost chunks (the second read's deliveries overran it).

        The buffer is numpy's `empty`: a `bytearray` would be zeroed first, a whole extra pass
        over memory before the first byte arrives.
        """
        meta = await self.meta(name)
        try:
            result, digest = await self._read(meta, bulk=self.use_bulk)
        except _ConnectionLost:  # the bulk connection broke: once more through nats-py
            result, digest = await self._read(meta, bulk=False)
        got = DIGEST_PREFIX + base64.urlsafe_b64encode(digest).decode()
        if got.upper() != meta.digest.upper():
            raise ObjectCorrupt(f"{name}: digest {got} differs from the metadata's {meta.digest}")
        return result

    async def _read(self, meta: ObjectMeta, *, bulk: bool) -> tuple[memoryview, bytes]:
        """The chunks in one buffer, and their SHA-256."""
        result = np.empty(meta.size, dtype=np.uint8).data
        if not (meta.chunks or meta.size):
            return result, hashlib.sha256().digest()
        with ThreadPoolExecutor(1, thread_name_prefix="objdigest") as pool:
            sink = _ChunkSink(meta, result, pool)
            await self._pull(meta, sink, bulk)
            return result, await sink.digest()

    async def _pull(self, meta: ObjectMeta, sink: _ChunkSink, bulk: bool) -> None:
        js = self.js
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE,
            deliver_policy=api.DeliverPolicy.ALL,
            filter_subject=self._chunk_subject(meta.nuid),
            inactive_threshold=max(self.timeout, 5.0),
            mem_storage=True,
            num_replicas=1,
        )
        consumer = (await js.add_consumer(self.stream, config=config)).name or ""
        inbox, release = await self._inbox(sink, consumer, bulk)
        pull = _Requests(self, meta, f"{js._prefix}.CONSUMER.MSG.NEXT.{self.stream}.{consumer}")
        try:
            for _ in range(PULLS_IN_FLIGHT):
                await pull.next(inbox)
            while not sink.complete:
                await sink.wait(self.timeout)
                while pull.requested < meta.chunks and sink.received >= pull.refill_at:
                    await pull.next(inbox)
        finally:
            await release()
            self._forget_consumer(consumer)

    async def _inbox(self, sink: _ChunkSink, consumer: str, bulk: bool) -> tuple[str, _Release]:
        """A reply subject whose messages reach `sink`: on the bulk connection if there is one."""
        connection = await self._bulk_connection() if bulk else None
        if connection is not None and connection.usable:
            inbox = connection.inbox(sink, consumer)

            async def release_bulk() -> None:
                connection.release(inbox, consumer)

            return inbox, release_bulk

        async def deliver(msg: Msg) -> None:
            sink.deliver(msg)

        inbox = self.js._nc.new_inbox()
        sub = await self.js._nc.subscribe(
            inbox, cb=deliver, pending_msgs_limit=0, pending_bytes_limit=0
        )
        return inbox, sub.unsubscribe

    async def _bulk_connection(self) -> BulkConnection | None:
        async with self._opening:  # concurrent reads share one connection
            if not self.use_bulk:
                return None
            if self._bulk is None or not self._bulk.usable:
                if self._bulk is not None:
                    self._bulk.close()
                self._bulk = None
                try:
                    self._bulk = await BulkConnection.open(self.js._nc)
                except BulkUnsupported:
                    self.use_bulk = False
                except (OSError, TimeoutError, BulkClosed):
                    pass  # this read goes through nats-py; the next one tries again
            return self._bulk

    def _forget_consumer(self, consumer: str) -> None:
        """Delete the consumer without waiting a round trip (it also expires by itself)."""

        async def delete() -> None:
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(self.stream, consumer)

        task = asyncio.create_task(delete())
        self._cleanup.add(task)
        task.add_done_callback(self._cleanup.discard)


class _Requests:
    """Pull requests for one read: `per_request` chunks each, until all chunks are asked for."""

    def __init__(self, store: WeightStore, meta: ObjectMeta, subject: str) -> None:
        self.store, self.meta, self.subject = store, meta, subject
        chunk = -(-meta.size // max(1, meta.chunks))  # the object's, not ours: stock is 128 KiB
        self.per_request = max(1, store.pull_bytes // max(1, chunk))
        self.requested = 0

    @property
    def refill_at(self) -> int:
        """Ask for more once this many chunks have come: keeps PULLS_IN_FLIGHT outstanding."""
        return self.requested - self.per_request * (PULLS_IN_FLIGHT - 1)

    async def next(self, inbox: str) -> None:
        batch = min(self.per_request, self.meta.chunks - self.requested)
        if batch <= 0:
            return
        self.requested += batch
        # Every chunk is stored before the metadata is written, so "no_wait" loses nothing: fewer
        # chunks than the metadata says (a purged or damaged object) ends in a 404 at once.
        request = {"batch": batch, "no_wait": True}
        await self.store.js._nc.publish(self.subject, json.dumps(request).encode(), reply=inbox)


class _ChunkSink:
    """Puts each chunk at its offset, checks its sequence, and hashes it on the worker thread."""

    def __init__(self, meta: ObjectMeta, target: memoryview, pool: ThreadPoolExecutor) -> None:
        self.meta, self.target, self.pool = meta, target, pool
        self.loop = asyncio.get_running_loop()
        self.hasher = hashlib.sha256()
        self.hashing: list[asyncio.Future[None]] = []
        self.offset = 0  # where the next chunk goes
        self._size = 0  # the size of the chunk being received
        self.received = 0
        self.error: Exception | None = None
        self.progress = asyncio.Event()

    @property
    def complete(self) -> bool:
        """Every chunk arrived; raises `ObjectCorrupt` if they do not add up to the size."""
        if self.received < self.meta.chunks:
            return False
        if self.offset != self.meta.size:
            self._fail(f"{self.meta.chunks} chunks of {self.offset} bytes, not {self.meta.size}")
            raise self.error or ObjectCorrupt(self.meta.name)
        return True

    async def wait(self, patience: float) -> None:
        """Until something arrives; raises what went wrong, `ObjectCorrupt` after `patience` s."""
        try:
            await asyncio.wait_for(self.progress.wait(), patience)
        except TimeoutError as err:
            self.error = self.error or ObjectCorrupt(
                f"{self.meta.name}: nothing for {patience:.0f}s after chunk {self.received}"
            )
            raise self.error from err
        self.progress.clear()
        if self.error is not None:
            raise self.error

    async def digest(self) -> bytes:
        await asyncio.gather(*self.hashing)
        return self.hasher.digest()

    # bulk.Sink

    def buffer_for(self, size: int) -> memoryview | None:
        if self.error is not None or self.offset + size > len(self.target):
            return None  # received as a copy, refused in `landed`
        self._size = size
        return self.target[self.offset : self.offset + size]

    def landed(self, reply: str, payload: bytes | None, status: str | None, about: str) -> None:
        if status is not None:
            if status != _IDLE_HEARTBEAT:
                self._fail(
                    f"ended after {self.received} of {self.meta.chunks} chunks", status, about
                )
        elif payload is not None and self.buffer_for(len(payload)) is None:
            self._fail(f"more bytes than the {self.meta.size} of the metadata")
        elif self._in_sequence(reply):
            end = self.offset + self._size
            if payload is not None:  # the nats-py path, or a chunk that came with headers
                self.target[self.offset : end] = payload
            piece = self.target[self.offset : end]
            self.hashing.append(self.loop.run_in_executor(self.pool, self.hasher.update, piece))
            self.offset, self.received = end, self.received + 1
        self.progress.set()

    def failed(self, error: Exception) -> None:
        if self.error is None:
            self.error = _ConnectionLost(f"{self.meta.name}: {error}")
        self.progress.set()

    def deliver(self, msg: Msg) -> None:
        """A message from the nats-py subscription."""
        headers = msg.headers or {}
        self.landed(
            msg.reply, msg.data, headers.get(api.Header.STATUS), headers.get("Description", "")
        )

    def _in_sequence(self, reply: str) -> bool:
        """Chunk n carries consumer sequence n in its reply subject, the last one 0 pending.

        $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>, with
        <domain>.<account hash> after ACK (and a token at the end) in the newer form.
        """
        tokens = reply.split(".")
        at = 6 if len(tokens) == 9 else 8 if len(tokens) >= 11 else None
        sequence, pending = (tokens[at], tokens[at + 2]) if at is not None else ("", "")
        if sequence != str(self.received + 1):
            self._fail(f"chunk {self.received + 1} arrived as {sequence or reply!r}")
        elif self.received + 1 == self.meta.chunks and pending != "0":
            self._fail(f"{pending} more chunks than the metadata's {self.meta.chunks}")
        return self.error is None

    def _fail(self, what: str, status: str | None = None, about: str = "") -> None:
        if self.error is None:
            detail = f" ({status} {about})" if status else ""
            self.error = ObjectCorrupt(f"{self.meta.name}: {what}{detail}")
