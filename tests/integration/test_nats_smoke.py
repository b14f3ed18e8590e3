"""The test nats-server is real: JetStream streams, pull consumers, acks and redelivery."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import nats
import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from polyrl.local.natsserver import NatsServer


async def test_jetstream_delivers_published_messages_and_honours_acks(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="SMOKE", subjects=["smoke.>"]))
        for i in range(3):
            ack = await js.publish("smoke.work", f"job-{i}".encode())
            assert ack.stream == "SMOKE"
        sub = await js.pull_subscribe(
            "smoke.work", durable="workers", config=ConsumerConfig(ack_wait=1.0)
        )
        first = await sub.fetch(3, timeout=5)
        assert [m.data for m in first] == [b"job-0", b"job-1", b"job-2"]
        await first[0].ack()
        await first[1].ack()
        # job-2 was never acked: JetStream redelivers it after ack_wait, and only it.
        again = await sub.fetch(1, timeout=5)
        assert again[0].data == b"job-2"
        assert again[0].metadata.num_delivered == 2
        await again[0].ack()
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=1.5)
        info = await js.consumer_info("SMOKE", "workers")
        assert info.num_ack_pending == 0
    finally:
        await nc.close()


async def test_the_object_store_round_trips_an_object_larger_than_one_chunk(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        store = await js.create_object_store("smoke-objects")
        payload = bytes(range(256)) * 8192  # 2 MiB
        await store.put("blob", payload)
        got = await asyncio.wait_for(store.get("blob"), timeout=30)
        assert got.data == payload
    finally:
        await nc.close()


def test_the_natsserver_command_prints_help_without_starting_a_server() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "polyrl.local.natsserver", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: python -m polyrl.local.natsserver")
    assert "Ctrl-C stops it" not in proc.stdout  # what a started server prints


def _as_a_background_job() -> None:
    """What a shell does to a command started with `&`: SIGINT ignored, inherited by exec."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_the_natsserver_command_serves_jetstream_until_ctrl_c_even_as_a_background_job() -> None:
    async def account_limits(url: str) -> object:
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream().account_info()).limits
        finally:
            await nc.close()

    with subprocess.Popen(
        [sys.executable, "-m", "polyrl.local.natsserver"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_a_background_job,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "OPEN: no authentication; Ctrl-C stops it)" in line  # without --trust
            assert asyncio.run(account_limits(line.split(" at ", 1)[1].split()[0])) is not None
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()  # a failure here must not leave the server behind
                raise
        assert code == 0
