"""The receive-only NATS protocol of the bulk connection, fed bytes split at every possible point."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyrl.workers.weightsync.bulk import BulkClosed, BulkConnection


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


class RecordingSink:
    """Takes payloads of `direct_sizes` into its own buffer, the rest as copies."""

    def __init__(self, room: int) -> None:
        self.buffer = bytearray(room)
        self.offset = 0
        self.events: list[tuple[str, bytes | None, str | None, str]] = []
        self.failures: list[Exception] = []

    def buffer_for(self, size: int) -> memoryview | None:
        if self.offset + size > len(self.buffer):
            return None
        view = memoryview(self.buffer)[self.offset : self.offset + size]
        self.offset += size
        return view

    def landed(self, reply: str, payload: bytes | None, status: str | None, about: str) -> None:
        self.events.append((reply, payload, status, about))

    def failed(self, error: Exception) -> None:
        self.failures.append(error)


def feed(conn: BulkConnection, data: bytes, cuts: list[int]) -> None:
    """Deliver `data` as the event loop would, in pieces ending at `cuts`, through get_buffer."""
    position = 0
    for end in [*sorted(set(cuts)), len(data)]:
        while position < end:
            buffer = conn.get_buffer(-1)
            n = min(len(buffer), end - position)
            buffer[:n] = data[position : position + n]
            conn.buffer_updated(n)
            position += n


def msg(subject: str, sid: int, reply: str, payload: bytes) -> bytes:
    return (
        f"MSG {subject} {sid} {reply} {len(payload)}\r\n".replace("  ", " ").encode()
        + payload
        + b"\r\n"
    )


def hmsg(subject: str, sid: int, reply: str, headers: bytes, payload: bytes) -> bytes:
    sizes = f"{len(headers)} {len(headers) + len(payload)}"
    line = f"HMSG {subject} {sid} {reply} {sizes}\r\n".replace("  ", " ")
    return line.encode() + headers + payload + b"\r\n"


STREAM = b"".join(
    [
        b'INFO {"server_id":"x","max_payload":8388608,"headers":true}\r\n',
        b"PING\r\n",
        msg("$O.b.C.x", 1, "$JS.ACK.S.C.1.5.1.0.1", b"0123456789"),
        b"+OK\r\n",
        msg("_INBOX.b", 2, "", b"other!"),  # another subscription: not ours, dropped
        msg("$O.b.C.x", 1, "$JS.ACK.S.OTHER.1.5.1.0.1", b"theirs"),  # another consumer: dropped
        hmsg("$O.b.C.x", 1, "$JS.ACK.S.C.1.6.2.0.0", b"NATS/1.0\r\nA: b\r\n\r\n", b"hello"),
        msg("_INBOX.a", 1, "", b"abcdefg"),  # too large for the room left: a copy
        msg("_INBOX.a", 1, "", b""),
        hmsg("_INBOX.a", 1, "", b"NATS/1.0 404 No Messages\r\n\r\n", b""),
        b"PONG\r\n",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
async def test_every_split_of_the_byte_stream_gives_the_same_messages(cuts: list[int]) -> None:
    conn = BulkConnection()
    transport = FakeTransport()
    conn.connection_made(transport)
    sink = RecordingSink(room=12)
    conn._sinks["_INBOX.a"] = conn._sinks["C"] = sink
    pong = asyncio.get_running_loop().create_future()
    conn._pongs.append(pong)
    feed(conn, STREAM, cuts)
    assert conn.error is None
    assert (await conn._info)["max_payload"] == 8388608
    assert pong.done()
    assert bytes(transport.written) == b"PONG\r\n"
    assert bytes(sink.buffer[:10]) == b"0123456789"
    assert sink.events == [
        ("$JS.ACK.S.C.1.5.1.0.1", None, None, ""),
        ("$JS.ACK.S.C.1.6.2.0.0", b"hello", None, ""),
        ("", b"abcdefg", None, ""),
        ("", b"", None, ""),
        ("", b"", "404", "No Messages"),
    ]


async def test_a_server_error_ends_the_connection_and_tells_every_sink() -> None:
    conn = BulkConnection()
    transport = FakeTransport()
    conn.connection_made(transport)
    sink = RecordingSink(room=0)
    conn._sinks["_INBOX.a"] = conn._sinks["C"] = sink
    feed(conn, b"-ERR 'Authorization Violation'\r\n", [])
    assert isinstance(conn.error, BulkClosed)
    assert transport.closed
    assert len(sink.failures) == 1
    assert not conn.usable
    with pytest.raises(BulkClosed):
        await conn.ping()
