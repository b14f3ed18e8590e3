"""A second, receive-only NATS connection that lands weight chunks straight in the result buffer.

Reading a keyframe through nats-py costs about 3 ms of CPU per MB on a busy core: its socket
reader hands over 32 KiB at a time, and its parser grows a `bytearray` and copies every payload
twice before a message object exists. At hundreds of MB per sync that CPU is the bottleneck, and
the SHA-256 the Object Store requires has to fit beside it. This connection speaks just enough of
the NATS client protocol to receive: CONNECT, SUB, MSG/HMSG, PING/PONG. It is an
`asyncio.BufferedProtocol`, so while a chunk's payload is arriving the event loop reads from the
socket directly into the slice of the caller's buffer where that chunk belongs: one kernel copy,
no parser copies.

It publishes nothing. The caller makes the pull consumer and sends pull requests over its normal
nats-py connection with an inbox of this connection as the reply subject; the server routes the
deliveries here. The connection subscribes once to a wildcard inbox when it opens, so a read
costs no SUB round trip: `inbox(sink, consumer)` names a fresh subject under it. Deliveries keep
their stream subject, so they are routed by the consumer named in their $JS.ACK reply subject, and
status messages (which have no reply) by the inbox subject; both lead to the read's `Sink`, which
says where each payload goes and hears about it.

Scope: plain TCP with no auth, user/password or token (the URL's or the client's options). A server
that wants TLS or nkey/JWT signatures (its INFO says so) makes `open` raise `BulkUnsupported`, and
the store falls back to reading through nats-py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, Protocol

from nats.aio.client import Client

_CRLF = b"\r\n"
_SCRATCH = 1 << 16  # control lines and small messages; payloads bypass it
_MAX_LINE = 4096


class BulkUnsupported(Exception):
    """The server wants something this connection does not speak (TLS, nkeys): use nats-py."""


class BulkClosed(ConnectionError):
    """The bulk connection ended or the server sent -ERR."""


class Sink(Protocol):
    """Where the payloads of one subscription go."""

    def buffer_for(self, size: int) -> memoryview | None:
        """A buffer of exactly `size` bytes for the next payload, or None to receive it in a copy."""

    def landed(self, reply: str, payload: bytes | None, status: str | None, about: str) -> None:
        """A message arrived: in the buffer given (`payload` None) or as `payload`.

        `status` is the status code of a JetStream status message (404, 408, 100, ...), else None.
        """

    def failed(self, error: Exception) -> None:
        """The connection ended; no more messages will arrive."""


class BulkConnection(asyncio.BufferedProtocol):
    """Receive-only NATS connection; `open` it from a connected nats-py client, `close` it."""

    def __init__(self) -> None:
        self._scratch = bytearray(_SCRATCH)
        self._view = memoryview(self._scratch)
        self._used = 0
        self._payload: _Payload | None = None
        self._sinks: dict[str, Sink] = {}  # by inbox subject and by consumer name
        self._inboxes = itertools.count(1)
        self._prefix = ""
        self._transport: asyncio.Transport | None = None
        self._info: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pongs: list[asyncio.Future[None]] = []
        self.error: Exception | None = None

    @classmethod
    async def open(cls, nc: Client, patience: float = 5.0) -> BulkConnection:
        url = nc.connected_url
        if url is None or url.scheme not in ("nats", "") or url.hostname is None:
            raise BulkUnsupported(f"not a plain TCP connection: {url}")
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(cls, url.hostname, url.port or 4222), patience
        )
        try:
            info = await asyncio.wait_for(conn._info, patience)
            if info.get("tls_required") or info.get("nonce"):
                raise BulkUnsupported("the server wants TLS or nkey signatures")
            conn._write(b"CONNECT " + json.dumps(_connect_options(nc)).encode() + _CRLF)
            conn._prefix = nc.new_inbox()
            conn._write(f"SUB {conn._prefix}.* 1\r\n".encode())
            await asyncio.wait_for(conn.ping(), patience)  # connected and subscribed
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def usable(self) -> bool:
        return self.error is None and self._transport is not None

    async def ping(self) -> None:
        """Round trip to the server: everything sent before (a SUB) has been processed."""
        pong = asyncio.get_running_loop().create_future()
        self._pongs.append(pong)
        self._write(b"PING\r\n")
        await pong

    def inbox(self, sink: Sink, consumer: str) -> str:
        """A reply subject for pull requests to `consumer`: its messages go to `sink`."""
        if not self.usable:
            raise BulkClosed(f"bulk connection is closed ({self.error})")
        subject = f"{self._prefix}.{next(self._inboxes)}"
        self._sinks[subject] = self._sinks[consumer] = sink
        return subject

    def release(self, subject: str, consumer: str) -> None:
        self._sinks.pop(subject, None)
        self._sinks.pop(consumer, None)

    def _route(self, subject: str, reply: str) -> Sink | None:
        tokens = reply.split(".")
        if len(tokens) >= 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
            return self._sinks.get(tokens[3] if len(tokens) == 9 else tokens[5])
        return self._sinks.get(subject)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _write(self, data: bytes) -> None:
        if self._transport is None or self.error is not None:
            raise BulkClosed(f"bulk connection is closed ({self.error})")
        self._transport.write(data)

    # asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(BulkClosed(f"bulk connection lost: {exc}"))
        self._transport = None

    def get_buffer(self, sizehint: int) -> memoryview:
        payload = self._payload
        if payload is not None and payload.direct:
            return payload.buffer[payload.filled :]
        if self._used == len(self._scratch):  # a line or small payload larger than scratch
            self._scratch.extend(bytes(len(self._scratch)))
            self._view = memoryview(self._scratch)
        return self._view[self._used :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            payload = self._payload
            if payload is not None and payload.direct:
                payload.filled += nbytes
                if payload.filled == len(payload.buffer):
                    self._payload_done(payload)
            else:
                self._used += nbytes
                self._drain_scratch()
        except Exception as err:  # a protocol error ends the connection
            self._fail(err)
            self.close()

    def _drain_scratch(self) -> None:
        start = 0
        while start < self._used:
            payload = self._payload
            if payload is not None:
                take = min(len(payload.buffer) - payload.filled, self._used - start)
                payload.buffer[payload.filled : payload.filled + take] = self._view[
                    start : start + take
                ]
                payload.filled += take
                start += take
                if payload.filled < len(payload.buffer):
                    break
                self._payload_done(payload)
                continue
            end = self._scratch.find(_CRLF, start, self._used)
            if end < 0:
                if self._used - start > _MAX_LINE:
                    raise BulkClosed("protocol line too long")
                break
            self._line(bytes(self._view[start:end]))
            start = end + 2
        self._scratch[: self._used - start] = self._view[start : self._used]
        self._used -= start

    def _line(self, line: bytes) -> None:
        op, _, rest = line.partition(b" ")
        op = op.upper()
        if op in (b"MSG", b"HMSG"):
            self._start_payload(op == b"HMSG", rest.decode().split())
        elif op == b"PING":
            self._write(b"PONG\r\n")
        elif op == b"PONG":
            if self._pongs:
                pong = self._pongs.pop(0)
                if not pong.done():
                    pong.set_result(None)
        elif op == b"INFO":
            if not self._info.done():
                self._info.set_result(json.loads(rest))
        elif op == b"-ERR":
            raise BulkClosed(f"server error: {rest.decode(errors='replace')}")
        # +OK and empty lines (the CRLF after a payload) need nothing

    def _start_payload(self, has_headers: bool, args: list[str]) -> None:
        subject, total = args[0], int(args[-1])
        header_size = int(args[-2]) if has_headers else 0
        reply = args[2] if len(args) == (5 if has_headers else 4) else ""
        sink = self._route(subject, reply)
        direct = None
        if sink is not None and not has_headers and total > 0:
            direct = sink.buffer_for(total)
            if direct is not None and len(direct) != total:
                raise BulkClosed(f"sink gave {len(direct)} bytes for a {total}-byte payload")
        buffer = direct if direct is not None else memoryview(bytearray(total))
        self._payload = _Payload(sink, reply, header_size, buffer, direct is not None)
        if total == 0:
            self._payload_done(self._payload)

    def _payload_done(self, payload: _Payload) -> None:
        self._payload = None
        if payload.sink is None:
            return  # unsubscribed meanwhile
        if payload.direct:
            payload.sink.landed(payload.reply, None, None, "")
            return
        status, about = _status(bytes(payload.buffer[: payload.header_size]))
        payload.sink.landed(
            payload.reply, bytes(payload.buffer[payload.header_size :]), status, about
        )

    def _fail(self, error: Exception) -> None:
        if self.error is not None:
            return
        self.error = error
        if not self._info.done():
            self._info.set_exception(error)
            self._info.exception()  # seen: `open` raises it if it is still waiting
        for pong in self._pongs:
            if not pong.done():
                pong.set_exception(error)
        self._pongs.clear()
        for sink in {id(sink): sink for sink in self._sinks.values()}.values():
            sink.failed(error)  # once each, though a sink is under two keys


class _Payload:
    __slots__ = ("buffer", "direct", "filled", "header_size", "reply", "sink")

    def __init__(
        self, sink: Sink | None, reply: str, header_size: int, buffer: memoryview, direct: bool
    ) -> None:
        self.sink, self.reply, self.header_size = sink, reply, header_size
        self.buffer, self.direct, self.filled = buffer, direct, 0


def _status(headers: bytes) -> tuple[str | None, str]:
    """The status code and description of a header block's first line ("NATS/1.0 404 No ...")."""
    first = headers.split(_CRLF, 1)[0].decode(errors="replace").split(" ", 2)
    if len(first) < 2 or not first[1].isdigit():
        return None, ""
    return first[1], first[2] if len(first) > 2 else ""


def _connect_options(nc: Client) -> dict[str, Any]:
    options: dict[str, Any] = {
        "verbose": False,
        "pedantic": False,
        "lang": "python-polyrl-bulk",
        "version": "1",
        "protocol": 1,
        "headers": True,
        "no_responders": True,
        "name": "polyrl-weights-bulk",
    }
    user, password, token = (_value(nc.options.get(k)) for k in ("user", "password", "token"))
    url = nc.connected_url
    if user is None and token is None and url is not None and url.username:
        user, password = url.username, url.password
        if password is None:
            user, token = None, user
    if user is not None and password is not None:
        options.update(user=user, **{"pass": password})
    elif token is not None:
        options["auth_token"] = token
    return options


def _value(option: object) -> str | None:
    if callable(option):
        option = option()
    return None if option is None else str(option)
