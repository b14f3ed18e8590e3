"""A userspace TCP proxy that makes loopback look like a link between regions.

Rollout pools in another region pull weights over a link of a few hundred Mbit/s with a round trip
of tens to hundreds of milliseconds, where the round trips of a sync (metadata, consumer, pull)
cost as much as the bytes of a small delta. `tc netem` needs root; this proxy needs nothing: each
direction is a pump that serialises bytes at `rate_bits` per second and delivers them `rtt / 2`
after they leave, like a link with a bounded queue in front of it. Used by `bench` to measure
weight sync, full against delta, as a remote replica would see it.

`cut()` blackholes the link, as a partition between regions does: nothing crosses in either
direction and new connections hang before reaching the server, while neither side is told
(no reset, no close), so each finds out only by its own timeouts. `heal()` lets the held
bytes through, in order, as TCP's retransmissions would.
"""

from __future__ import annotations

import asyncio

_PIECE = 64 << 10  # bytes read at once; the link's granularity
_QUEUE = 64  # pieces queued per direction (4 MiB): the link's buffer


class ShapedProxy:
    """Listens on 127.0.0.1; every connection is relayed to `target` through a shaped link."""

    def __init__(self, target_host: str, target_port: int, *, rate_bits: float, rtt: float) -> None:
        self.target = (target_host, target_port)
        self.rate = rate_bits / 8  # bytes per second
        self.delay = rtt / 2
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._relays: set[asyncio.Task[None]] = set()
        self._open = asyncio.Event()
        self._open.set()

    def cut(self) -> None:
        """Blackhole the link: hold every byte and every new connection until `heal`."""
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ShapedProxy:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close every relayed socket: the pumps see the end of their streams and return."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._relays, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        self._writers.add(client_w)
        try:
            await self._open.wait()  # a connection made during a cut reaches nothing yet
            server_r, server_w = await asyncio.open_connection(*self.target)
            self._writers.add(server_w)
            await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))
        except OSError:
            pass
        finally:
            self._relays.discard(task)
            client_w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Bytes leave one at a time at `rate` and arrive `delay` after leaving."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE)
        deliver = asyncio.create_task(self._deliver(queue, writer))
        link_free = loop.time()
        try:
            while data := await reader.read(_PIECE):
                link_free = max(loop.time(), link_free) + len(data) / self.rate
                await queue.put((link_free + self.delay, data))
            await queue.put(None)
            await deliver
        finally:
            deliver.cancel()
            await asyncio.gather(deliver, return_exceptions=True)

    async def _deliver(
        self, queue: asyncio.Queue[tuple[float, bytes] | None], writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        broken = False  # the far side is gone: keep taking pieces so the pump never blocks
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                if broken:
                    continue
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await self._open.wait()
                try:
                    writer.write(data)
                    await writer.drain()
                except OSError:
                    broken = True
        finally:
            writer.close()
