"""Riding out a lost NATS server: a restart, a failover, a partition that heals.

A worker's connection reconnects by itself (it connects with unlimited reconnects) and
nats.py restores its subscriptions, so while the server is away the worker only has to wait.
What fails in between is whatever needed an answer: a JetStream publish waits for the
stream's ack, a key-value put or an object read for the server's reply, and each of those
raises a timeout, "no responders" or "JetStream unavailable" until the server is back and
JetStream has recovered its streams. Left alone, any of those would end the worker, the pod
would be replaced and a trainer would resume from its last checkpoint: a few seconds of NATS
downtime would cost minutes of training.

`retry` repeats such an operation until it goes through, for up to `patience()` seconds
(`POLYRL_NATS_OUTAGE_SECONDS`, default five minutes), then gives up with `Unavailable`, so a
server that is really gone still ends the worker with a clear reason. It is only for
operations that are safe to repeat: publishes that carry a message id (JetStream stores
them once), reads, puts that overwrite what they wrote, and a rollout worker's round (what it
fetched and did not answer is redelivered).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

from polyrl.workers.errors import Unavailable

log = logging.getLogger("polyrl.worker")
T = TypeVar("T")
PATIENCE_ENV = "POLYRL_NATS_OUTAGE_SECONDS"
DEFAULT_PATIENCE = 300.0
# What an operation meets while the server is away or JetStream is recovering. A closed
# connection (ConnectionClosedError) is not among them: nothing reconnects it.
TRANSIENT: tuple[type[BaseException], ...] = (
    TimeoutError,  # nats.errors.TimeoutError and FlushTimeoutError are TimeoutErrors too
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    ConnectionError,
)


def patience() -> float:
    return float(os.environ.get(PATIENCE_ENV, DEFAULT_PATIENCE))


async def retry(op: Callable[[], Awaitable[T]], *, what: str, seconds: float | None = None) -> T:
    """`op()` until it goes through; `Unavailable` naming `what` after `seconds`."""
    deadline = time.monotonic() + (patience() if seconds is None else seconds)
    pause, warned = 0.25, False
    while True:
        try:
            result = await op()
        except TRANSIENT as err:
            if time.monotonic() + pause > deadline:
                raise Unavailable(f"NATS did not come back for {what}: {err!r}") from err
            if not warned:
                log.warning("NATS unavailable (%r): %s waits for it", err, what)
                warned = True
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)  # each try that timed out has waited already
            continue
        if warned:
            log.info("NATS is back: %s went through", what)
        return result
