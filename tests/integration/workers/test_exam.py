"""The verifier's exam travels from the solver's trainer to the verifier's through NATS."""

from __future__ import annotations

import logging

import nats
import pytest

from polyrl.api import natsconfig
from polyrl.api.naming import JobNames
from polyrl.testing.natsserver import NatsServer
from polyrl.workers import exam


async def test_published_answers_are_fetched_as_they_were(nats_server: NatsServer) -> None:
    names = JobNames(namespace="t", job="exam")
    nc = await nats.connect(nats_server.url)
    try:
        await natsconfig.ensure(nc.jetstream(), names, ["solver", "verifier"])
        await exam.publish(nc.jetstream(), names, "solver", ["12", "107", ""])
        got = await exam.fetch(nc.jetstream(), names, "solver", timeout=5)
    finally:
        await nc.close()
    assert got == ["12", "107", ""]


async def test_without_answers_the_verifier_goes_without_an_exam_and_says_why(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    names = JobNames(namespace="t", job="noexam")
    nc = await nats.connect(nats_server.url)
    try:
        await natsconfig.ensure(nc.jetstream(), names, ["solver", "verifier"])
        with caplog.at_level(logging.WARNING, logger="polyrl.exam"):
            assert await exam.fetch(nc.jetstream(), names, "solver", timeout=1, poll=0.2) is None
        assert "published no answers" in caplog.text
        store = await nc.jetstream().object_store(names.weights_bucket("solver"))
        await store.put(exam.OBJECT, b'{"answers": [1, 2]}')
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="polyrl.exam"):
            assert await exam.fetch(nc.jetstream(), names, "solver", timeout=1) is None
        assert "not a list of strings" in caplog.text
    finally:
        await nc.close()
