"""Per-role NATS users are refused everything outside their grant, on a real nats-server.

One server trusts a fresh operator (`polyrl.api.natsjwt.Trust`); an admin user creates two
jobs' streams and buckets, as the operator does; then users signed with the grants of
`polyrl.api.access` try what their role must not do. Each attempt counts as refused only if
the server said so (a permissions violation reaches the client's error callback) *and* the
effect is absent (checked as admin). Allowed operations are checked alongside, so a grant
that refused everything would fail too. The table is printed (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig

from polyrl.api import access, natsconfig, natsjwt
from polyrl.api.launch import Role
from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.testing.waiting import wait_until_async

pytestmark = pytest.mark.slow

A = JobNames(namespace="team-a", job="math")
B = JobNames(namespace="team-b", job="chat")
POLICIES = ["solver", "verifier", "judge"]
REFUSAL_WAIT = 3.0


@dataclass
class User:
    nc: Client
    errors: list[str] = field(default_factory=list)

    def violations(self) -> int:
        return sum("permissions violation" in e for e in self.errors)


@dataclass
class Cluster:
    server: NatsServer
    trust: natsjwt.Trust
    admin: Client
    tmp: Path
    users: list[User] = field(default_factory=list)

    async def user(
        self, names: JobNames, role: Role, policy: str | None, served: tuple[str, ...] = ()
    ) -> User:
        grant = access.grant(names, role, policy, POLICIES, served=served)
        creds = self.tmp / f"{names.job}-{role}-{policy}.creds"
        creds.write_text(self.trust.signer.user_creds(f"{names.job}-{role}", grant))
        user = User(nc=None)  # type: ignore[arg-type]

        async def record(err: Exception) -> None:
            user.errors.append(str(err).lower())

        user.nc = await nats.connect(
            self.server.url,
            user_credentials=str(creds),
            inbox_prefix=access.inbox_prefix(names, role, policy),
            error_cb=record,
            max_reconnect_attempts=0,
        )
        self.users.append(user)
        return user


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    trust = natsjwt.Trust.new()
    with NatsServer(tmp_path / "nats", trust=trust) as server:
        creds = tmp_path / "admin.creds"
        creds.write_text(trust.signer.user_creds("admin", access.ADMIN))
        admin = await nats.connect(server.url, user_credentials=str(creds))
        for names in (A, B):
            await natsconfig.ensure(admin.jetstream(), names, POLICIES)
        made = Cluster(server, trust, admin, tmp_path)
        try:
            yield made
        finally:
            for user in made.users:
                await user.nc.close()
            await admin.close()


async def refused(user: User, attempt: Callable[[], Awaitable[object]]) -> bool:
    """Did the server refuse `attempt`: a new permissions violation for this user. A refused
    request is never answered, so the attempt is cancelled once the violation has come."""
    before = user.violations()
    task = asyncio.ensure_future(attempt())

    async def violated() -> bool:
        if task.done():
            await user.nc.flush()  # a publish is refused after it returns
        return user.violations() > before

    with contextlib.suppress(AssertionError):  # none came: the caller's table says ALLOWED
        await wait_until_async(
            "a permissions violation", violated, timeout=REFUSAL_WAIT, interval=0.02
        )
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return user.violations() > before


async def messages(admin: Client, stream: str) -> int:
    return (await admin.jetstream().stream_info(stream)).state.messages


async def test_a_rollout_user_is_refused_everything_outside_its_policys_requests_and_weights(
    cluster: Cluster,
) -> None:
    rollout = await cluster.user(A, Role.ROLLOUT, "solver")
    js = rollout.nc.jetstream()
    a_weights = A.weights_bucket("solver")
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "publish to job B's requests": lambda: rollout.nc.publish(
            B.requests_subject("solver"), b"{}"
        ),
        "publish to its own job's trajectories": lambda: js.publish(
            A.trajectories_subject("solver"), b"{}"
        ),
        "write its own policy's weights bucket": lambda: rollout.nc.publish(
            f"$O.{a_weights}.C.forged", b"x"
        ),
        "announce weights for its own policy": lambda: rollout.nc.publish(
            A.weights_subject("solver"), b"{}"
        ),
        "read job B's trajectories (consumer)": lambda: js.add_consumer(
            B.trajectories_stream("solver"), ConsumerConfig(durable_name="spy")
        ),
        "read job B's trajectories (subscription)": lambda: rollout.nc.subscribe(
            B.trajectories_subject("solver")
        ),
        "read job B's replies (inbox)": lambda: rollout.nc.subscribe("_i.team-b.>"),
        "read the other policy's requests": lambda: js.add_consumer(
            A.requests_stream("verifier"), ConsumerConfig(durable_name="spy")
        ),
        "create a stream": lambda: js.add_stream(name="spy", subjects=["spy.>"]),
        "delete its own requests stream": lambda: js.delete_stream(A.requests_stream("solver")),
        "list the account's streams": lambda: js.streams_info(),
    }
    table = {what: await refused(rollout, attempt) for what, attempt in attempts.items()}
    print_table("rollout of team-a/math, policy solver", table)
    assert all(table.values()), [what for what, ok in table.items() if not ok]
    assert await messages(cluster.admin, B.requests_stream("solver")) == 0
    assert await messages(cluster.admin, A.trajectories_stream("solver")) == 0
    assert await messages(cluster.admin, f"OBJ_{a_weights}") == 0
    names = {s.config.name for s in await cluster.admin.jetstream().streams_info()}
    assert "spy" not in names
    assert A.requests_stream("solver") in names
    # what it is for still works: its requests queue and its weights bucket
    await cluster.admin.jetstream().publish(A.requests_subject("solver"), b"{}")
    sub = await js.pull_subscribe(
        A.requests_subject("solver"), durable="rollout", stream=A.requests_stream("solver")
    )
    assert len(await sub.fetch(1, timeout=5)) == 1
    await js.object_store(a_weights)
    assert rollout.violations() == len(attempts)  # one each, and nothing else refused


async def test_a_shared_pools_user_reads_exactly_its_policies_requests_and_weights(
    cluster: Cluster,
) -> None:
    """`rollout.servedBy: solver` on the verifier: the solver's rollout user serves both,
    and still nothing of the third policy's."""
    pool = await cluster.user(A, Role.ROLLOUT, "solver", served=("verifier",))
    js = pool.nc.jetstream()
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "read the third policy's requests": lambda: js.add_consumer(
            A.requests_stream("judge"), ConsumerConfig(durable_name="spy")
        ),
        "open the third policy's weights bucket": lambda: js.object_store(
            A.weights_bucket("judge")
        ),
        "hear the third policy's announcements": lambda: pool.nc.subscribe(
            A.weights_subject("judge")
        ),
        "write the served policy's weights bucket": lambda: pool.nc.publish(
            f"$O.{A.weights_bucket('verifier')}.C.forged", b"x"
        ),
        "read job B's served policy's requests": lambda: js.add_consumer(
            B.requests_stream("verifier"), ConsumerConfig(durable_name="spy")
        ),
    }
    table = {what: await refused(pool, attempt) for what, attempt in attempts.items()}
    print_table("shared pool of team-a/math solver, serving verifier", table)
    assert all(table.values()), [what for what, ok in table.items() if not ok]
    for policy in ("solver", "verifier"):  # what it is for: both queues and both buckets
        await cluster.admin.jetstream().publish(A.requests_subject(policy), b"{}")
        sub = await js.pull_subscribe(
            A.requests_subject(policy), durable="rollout", stream=A.requests_stream(policy)
        )
        assert len(await sub.fetch(1, timeout=5)) == 1, policy
        await js.object_store(A.weights_bucket(policy))
        await pool.nc.subscribe(A.weights_subject(policy))
    await pool.nc.flush()
    assert pool.violations() == len(attempts)  # one each, and nothing else refused
    alone = await cluster.user(A, Role.ROLLOUT, "judge")  # a pool that serves nobody else
    ajs = alone.nc.jetstream()
    theirs: dict[str, Callable[[], Awaitable[object]]] = {
        "read the verifier's requests": lambda: ajs.add_consumer(
            A.requests_stream("verifier"), ConsumerConfig(durable_name="spy")
        ),
        "open the verifier's weights bucket": lambda: ajs.object_store(
            A.weights_bucket("verifier")
        ),
    }
    table = {what: await refused(alone, attempt) for what, attempt in theirs.items()}
    print_table("rollout of team-a/math judge, serving only itself", table)
    assert all(table.values()), [what for what, ok in table.items() if not ok]


async def test_a_trainer_user_writes_only_its_own_policys_weights(cluster: Cluster) -> None:
    trainer = await cluster.user(A, Role.TRAINER, "solver")
    js = trainer.nc.jetstream()
    other = A.weights_bucket("verifier")
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "write the other policy's weights bucket": lambda: trainer.nc.publish(
            f"$O.{other}.C.forged", b"x"
        ),
        "announce the other policy's weights": lambda: trainer.nc.publish(
            A.weights_subject("verifier"), b"{}"
        ),
        "purge the other policy's weights bucket": lambda: js.purge_stream(f"OBJ_{other}"),
        "write job B's weights bucket": lambda: trainer.nc.publish(
            f"$O.{B.weights_bucket('solver')}.C.forged", b"x"
        ),
        # Its own pool's requests it may publish (`trainer.evalOn: rollout`), no other's.
        "publish the other policy's requests": lambda: trainer.nc.publish(
            A.requests_subject("verifier"), b"{}"
        ),
        "publish trajectories": lambda: trainer.nc.publish(A.trajectories_subject("solver"), b"{}"),
    }
    table = {what: await refused(trainer, attempt) for what, attempt in attempts.items()}
    print_table("trainer of team-a/math, policy solver", table)
    assert all(table.values()), [what for what, ok in table.items() if not ok]
    assert await messages(cluster.admin, f"OBJ_{other}") == 0
    assert await messages(cluster.admin, A.trajectories_stream("solver")) == 0
    own = await js.object_store(A.weights_bucket("solver"))  # its own bucket takes a put
    await own.put("v1", b"weights")
    written = await cluster.admin.jetstream().object_store(A.weights_bucket("solver"))
    assert (await written.get("v1")).data == b"weights"
    assert trainer.violations() == len(attempts)


async def test_a_publisher_user_puts_its_frozen_policys_model_and_nothing_else(
    cluster: Cluster,
) -> None:
    publisher = await cluster.user(A, Role.PUBLISHER, "judge")
    js = publisher.nc.jetstream()
    own, other = A.weights_bucket("judge"), A.weights_bucket("solver")
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "write another policy's weights bucket": lambda: publisher.nc.publish(
            f"$O.{other}.C.forged", b"x"
        ),
        "announce another policy's weights": lambda: publisher.nc.publish(
            A.weights_subject("solver"), b"{}"
        ),
        # Unlike a trainer's, its bucket is never bounded or pruned by it.
        "purge its own weights bucket": lambda: js.purge_stream(f"OBJ_{own}"),
        "bound its own weights bucket": lambda: publisher.nc.request(
            f"$JS.API.STREAM.UPDATE.OBJ_{own}", b"{}", timeout=REFUSAL_WAIT
        ),
        "publish requests": lambda: publisher.nc.publish(A.requests_subject("judge"), b"{}"),
        "publish trajectories": lambda: publisher.nc.publish(
            A.trajectories_subject("solver"), b"{}"
        ),
        "read trajectories": lambda: js.pull_subscribe(
            A.trajectories_subject("solver"), stream=A.trajectories_stream("solver")
        ),
        "read the job's heartbeats": lambda: publisher.nc.request(
            f"$JS.API.DIRECT.GET.KV_{A.heartbeats_bucket}", b"{}", timeout=REFUSAL_WAIT
        ),
        "write job B's weights bucket": lambda: publisher.nc.publish(
            f"$O.{B.weights_bucket('judge')}.C.forged", b"x"
        ),
    }
    table = {what: await refused(publisher, attempt) for what, attempt in attempts.items()}
    print_table("publisher of team-a/math, frozen policy judge", table)
    assert all(table.values()), [what for what, ok in table.items() if not ok]
    assert await messages(cluster.admin, f"OBJ_{other}") == 0
    assert await messages(cluster.admin, A.trajectories_stream("solver")) == 0
    bucket = await js.object_store(own)  # what it is for: its own bucket takes the model
    await bucket.put("bundle", b"config and tokenizer")
    await publisher.nc.jetstream().publish(A.weights_subject("judge"), b"{}")
    written = await cluster.admin.jetstream().object_store(own)
    assert (await written.get("bundle")).data == b"config and tokenizer"
    assert await messages(cluster.admin, A.weights_stream("judge")) == 1
    assert publisher.violations() == len(attempts)


def print_table(who: str, table: dict[str, bool]) -> None:
    print(f"\n{who}: {sum(table.values())} of {len(table)} attempts refused")
    for what, ok in table.items():
        print(f"  {'refused' if ok else 'ALLOWED'}  {what}")
