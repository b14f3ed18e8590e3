"""Signed users expire on a real nats-server, and a worker whose creds file is renewed in
time keeps its connection going across the expiry.

The server trusts a fresh operator (`polyrl.api.natsjwt.Trust`), as in test_nats_access.py;
users are signed with an `exp` four or five seconds away (JWTs count whole seconds, and a
loaded machine must still connect and subscribe before it). The worker side is the real one:
`Runtime.connect` reading `POLYRL_NATS_CREDS_FILE`, a file written the kubelet's way (the
node agent's atomic writer: a new directory behind the `..data` symlink), as a pod's
mounted users Secret is when the operator renews it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from polyrl.api import access, natsconfig, natsjwt
from polyrl.api.launch import NATS_CREDS_FILE_ENV, NATS_USER_FILE, Role, WorkerConfig
from polyrl.api.messages import Heartbeat
from polyrl.api.naming import JobNames
from polyrl.api.resources import RLJobSpec
from polyrl.local.natsserver import NatsServer
from polyrl.testing.nodeagent import volumes
from polyrl.testing.waiting import wait_until_async
from polyrl.workers.runtime.worker import Runtime

pytestmark = pytest.mark.slow

NAMES = JobNames(namespace="t", job="renew")
POLICY = "solver"
LASTING = 5.0  # seconds: `exp` is whole seconds, so a user lasts 4 to 5 of them


class Trusted:
    """A server that admits only `trust`'s users, and an admin connection to it."""

    def __init__(self, server: NatsServer, trust: natsjwt.Trust, admin: Client) -> None:
        self.server, self.trust, self.admin = server, trust, admin

    def rollout_creds(self, *, lasting: float) -> str:
        grant = access.grant(NAMES, Role.ROLLOUT, POLICY, [POLICY])
        return self.trust.signer.user_creds(
            "t/renew/rollout-solver", grant, expires=time.time() + lasting
        )


@pytest.fixture
async def trusted(tmp_path: Path) -> AsyncIterator[Trusted]:
    trust = natsjwt.Trust.new()
    with NatsServer(tmp_path / "nats", trust=trust) as server:
        creds = tmp_path / "admin.creds"
        creds.write_text(trust.signer.user_creds("admin", access.ADMIN))
        admin = await nats.connect(server.url, user_credentials=str(creds))
        await natsconfig.ensure(admin.jetstream(), NAMES, [POLICY])
        try:
            yield Trusted(server, trust, admin)
        finally:
            await admin.close()


def exp_of(creds: str) -> int:
    """When the user of a creds file's text expires."""
    token = creds.split("-----BEGIN NATS USER JWT-----\n")[1].split("\n")[0]
    return int(natsjwt.decode(token)["exp"])


async def test_a_user_is_dropped_and_refused_once_its_jwt_expires(
    trusted: Trusted, tmp_path: Path
) -> None:
    creds = tmp_path / "rollout.creds"
    creds.write_text(text := trusted.rollout_creds(lasting=LASTING))
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc = await nats.connect(
        trusted.server.url,
        user_credentials=str(creds),
        inbox_prefix=access.inbox_prefix(NAMES, Role.ROLLOUT, POLICY),
        closed_cb=on_closed,
        allow_reconnect=False,
    )
    sub = await nc.subscribe(NAMES.drain_subject(POLICY, "rollout-0"))
    await nc.flush()  # the server has the subscription before the admin publishes
    await trusted.admin.publish(NAMES.drain_subject(POLICY, "rollout-0"), b"before")
    assert (await sub.next_msg(timeout=2)).data == b"before"  # a valid user, while it lasts

    refusals = []
    await asyncio.wait_for(closed.wait(), timeout=LASTING + 3)
    refusals.append(str(nc.last_error))  # the live connection, dropped by the server
    # The server compares whole seconds: in the second of `exp` it still admits the user
    # (and drops it at once); from the next one on it refuses the CONNECT.
    await wait_until_async("the second after the expiry", lambda: time.time() >= exp_of(text) + 1)
    again = Client()
    try:
        with pytest.raises(nats.errors.Error) as refused:
            await again.connect(
                trusted.server.url,
                user_credentials=str(creds),
                allow_reconnect=False,
                max_reconnect_attempts=0,
            )
    finally:
        await again.close()
    refusals.append(str(refused.value))  # a new connection with the same file
    print("refusals after expiry:", refusals)
    assert "user authentication expired" in refusals[0].lower()
    assert "authorization violation" in refusals[1].lower()
    assert len(refusals) == 2


def config(url: str) -> WorkerConfig:
    spec = RLJobSpec.model_validate(
        {"policies": [{"name": POLICY, "model": {"path": "tiny-llama://renew"}}]}
    )
    return WorkerConfig(
        namespace=NAMES.namespace,
        job=NAMES.job,
        role=Role.ROLLOUT,
        policy=POLICY,
        nats_url=url,
        spec=spec,
    )


async def test_a_worker_reconnects_with_its_renewed_creds_file_when_its_user_expires(
    trusted: Trusted,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    mount = tmp_path / "nats-user"  # what the kubelet keeps in the pod's Secret volume

    def kubelet_writes(creds: str) -> None:
        assert volumes.write_atomic(mount, {NATS_USER_FILE: (creds.encode(), 0o440)})

    first = trusted.rollout_creds(lasting=LASTING)
    expires = exp_of(first)
    kubelet_writes(first)
    monkeypatch.setenv(NATS_CREDS_FILE_ENV, str(mount / NATS_USER_FILE))
    caplog.set_level(logging.WARNING, logger="polyrl.worker")
    rt = await Runtime.connect(config(trusted.server.url), "rollout-0")
    try:
        drain = await rt.nc.subscribe(NAMES.drain_subject(POLICY, "rollout-0"))
        kubelet_writes(trusted.rollout_creds(lasting=60))  # the operator renewed the user
        await wait_until_async("the server to drop the expired user", lambda: time.time() > expires)
        await wait_until_async(
            "the worker to reconnect",
            lambda: rt.nc.stats["reconnects"] >= 1 and rt.nc.is_connected,
        )
        await rt.nc.flush()  # the server has the replayed subscription
        assert any("AuthExpired" in r.getMessage() for r in caplog.records), caplog.text

        # After the expiry: a subscription made before it still receives, JetStream works.
        await trusted.admin.publish(NAMES.drain_subject(POLICY, "rollout-0"), b"after")
        assert (await drain.next_msg(timeout=2)).data == b"after"
        await rt.beat()
        kv = await trusted.admin.jetstream().key_value(NAMES.heartbeats_bucket)
        entry = await kv.get(JobNames.heartbeat_key(POLICY, "rollout", "rollout-0"))
        assert entry.value is not None
        assert Heartbeat.model_validate_json(entry.value).at > expires
    finally:
        await rt.close()
