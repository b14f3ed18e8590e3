"""A NATS connection that outlives its user's JWT: reconnect when the server says it expired.

The operator signs each job's users with an expiry and renews them while the job lives
(`polyrl.operator.natsusers`); a pod reads its user from a mounted Secret file that the
kubelet replaces when the Secret changes. nats-server closes a connection whose JWT expires
with `-ERR 'User Authentication Expired'`. nats-py (2.16) treats every `-ERR` it does not
know as fatal and closes the client for good, so the worker would lose NATS once per
lifetime of its user. Here that error starts a reconnect instead, as nats.go does: nats-py
reads the creds file again on every (re)connect (`user_credentials=<path>`), so the new
connection presents the renewed user. While the file still holds the expired one, the server
refuses the CONNECT ("Authorization Violation") and nats-py retries, every
`reconnect_time_wait`, until the file is renewed.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client as NatsClient
from nats.errors import Error

AUTH_EXPIRED = "user authentication expired"


class AuthExpired(Error):
    """The server closed the connection because the user's JWT expired."""

    def __str__(self) -> str:
        return "nats: user authentication expired (reconnecting with the creds file as it is now)"


class Client(NatsClient):
    """nats-py's client, reconnecting (instead of closing) when its user expires."""

    async def _process_err(self, err_msg: str) -> None:
        if AUTH_EXPIRED not in err_msg.lower():
            await super()._process_err(err_msg)
            return
        self._err = AuthExpired()
        await self._error_cb(self._err)
        await self._process_op_err(self._err)


async def connect(servers: str | list[str], **options: Any) -> Client:
    """`nats.connect`, with a `Client` that survives its user's expiry."""
    nc = Client()
    await nc.connect(servers, **options)
    return nc
