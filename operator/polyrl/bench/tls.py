"""`polyrl bench tls`: what NATS over TLS costs, against an open server in the same run.

Two nats-servers from `polyrl.local.natsserver`, one plain and one with TLS (certificates
made in the run by `polyrl.testing.pki`, the client verifying the server and presenting its
own certificate, as a worker with a full credentials Secret does). Against each, alternating:

- `connect_s`: median time of a connection as a worker makes it (`nats.connect` with the
  context `polyrl.api.natstls.context` builds from the Secret's files), until the server's
  INFO/CONNECT/PONG exchange is done;
- `publish_msgs_per_s`: JetStream publishes of trajectory-sized messages, each acknowledged
  (as the workflow runner publishes), then consumed in batches and acknowledged;
- `ratio`s: TLS over plain, for the connection time and the message rate.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StreamConfig

from polyrl.api import natstls
from polyrl.local.natsserver import NatsServer, ServerTls
from polyrl.testing import pki

MESSAGE_BYTES = 330  # a trajectory of 16 tokens (`polyrl bench dataplane`)
QUICK = {"connects": 10, "messages": 1000, "rounds": 3}
FULL = {"connects": 40, "messages": 5000, "rounds": 5}


async def connect_seconds(url: str, options: dict[str, Any], count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        nc = await nats.connect(url, **options)
        times.append(time.perf_counter() - started)
        await nc.close()
    return statistics.median(times)


async def message_rate(url: str, options: dict[str, Any], count: int) -> float:
    """Acknowledged publishes, then batched consumption with acks: messages a second."""
    nc = await nats.connect(url, **options)
    try:
        js = nc.jetstream()
        name = f"bench-tls-{uuid.uuid4().hex[:6]}"
        await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.x"]))
        payload = b"x" * MESSAGE_BYTES
        started = time.perf_counter()
        for i in range(count):
            await js.publish(f"{name}.x", payload, headers={"Nats-Msg-Id": f"m{i}"})
        sub = await js.pull_subscribe(f"{name}.x", durable="bench", stream=name)
        got = 0
        while got < count:
            for msg in await sub.fetch(min(256, count - got), timeout=5):
                await msg.ack()
                got += 1
        rate = count / (time.perf_counter() - started)
        await js.delete_stream(name)
        return rate
    finally:
        await nc.close()


def client_dir(made: pki.Pki, root: Path) -> Path:
    """What a worker finds where the job's credentials Secret is mounted."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(made.ca.cert, root / natstls.CA)
    shutil.copy(made.admin.cert, root / natstls.CERT)
    shutil.copy(made.admin.key, root / natstls.KEY)
    return root


async def _measure(plain: str, tls: str, context: Any, plan: dict[str, int]) -> dict[str, Any]:
    sides: dict[str, tuple[str, dict[str, Any]]] = {
        "plain": (plain, {}),
        "tls": (tls, {"tls": context}),
    }
    connects: dict[str, list[float]] = {"plain": [], "tls": []}
    rates: dict[str, list[float]] = {"plain": [], "tls": []}
    for _ in range(plan["rounds"]):  # alternating, so drift hits both sides alike
        for side, (url, options) in sides.items():
            connects[side].append(await connect_seconds(url, options, plan["connects"]))
            rates[side].append(await message_rate(url, options, plan["messages"]))
    figures: dict[str, Any] = {}
    for side in sides:
        figures[f"{side}_connect_s"] = round(statistics.median(connects[side]), 5)
        figures[f"{side}_msgs_per_s"] = round(statistics.median(rates[side]), 1)
    figures["connect_tls_over_plain"] = round(
        figures["tls_connect_s"] / figures["plain_connect_s"], 2
    )
    figures["rate_tls_over_plain"] = round(
        figures["tls_msgs_per_s"] / figures["plain_msgs_per_s"], 3
    )
    return figures


def run(*, quick: bool) -> dict[str, Any]:
    plan = QUICK if quick else FULL
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-tls-") as tmp:
        root = Path(tmp)
        made = pki.generate(root / "pki")
        server_tls = ServerTls(
            made.apiserver.cert, made.apiserver.key, made.ca.cert, verify_clients=True
        )
        context = natstls.context(client_dir(made, root / "secret"))
        with (
            NatsServer(root / "plain") as plain,
            NatsServer(root / "tls", tls=server_tls) as secure,
        ):
            figures = asyncio.run(_measure(plain.url, secure.url, context, plan))
    figures |= {
        "quick": quick,
        "message_bytes": MESSAGE_BYTES,
        "messages": plan["messages"],
        "connects": plan["connects"],
        "rounds": plan["rounds"],
        "total_s": round(time.monotonic() - started, 1),
    }
    return figures
