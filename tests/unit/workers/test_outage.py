"""outage.retry waits out what a lost server raises, and only that."""

from __future__ import annotations

import nats.errors
import pytest

from polyrl.workers.errors import Unavailable
from polyrl.workers.runtime import outage


class Flaky:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures, self.calls = failures, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "through"


async def test_an_operation_that_times_out_while_the_server_is_away_goes_through_after() -> None:
    op = Flaky([TimeoutError(), nats.errors.NoRespondersError(), nats.errors.TimeoutError()])
    assert await outage.retry(op, what="a test publish", seconds=10) == "through"
    assert op.calls == 4


async def test_a_server_that_stays_away_ends_in_unavailable_naming_the_operation() -> None:
    op = Flaky([TimeoutError()] * 100)
    with pytest.raises(Unavailable, match="a test publish"):
        await outage.retry(op, what="a test publish", seconds=0.6)
    assert 2 <= op.calls < 100


async def test_errors_that_waiting_cannot_mend_propagate_at_once() -> None:
    op = Flaky([nats.errors.ConnectionClosedError(), ValueError("bad")])
    with pytest.raises(nats.errors.ConnectionClosedError):
        await outage.retry(op, what="x", seconds=10)
    with pytest.raises(ValueError, match="bad"):
        await outage.retry(op, what="x", seconds=10)
    assert op.calls == 2


def test_patience_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(outage.PATIENCE_ENV, "12.5")
    assert outage.patience() == 12.5
    monkeypatch.delenv(outage.PATIENCE_ENV)
    assert outage.patience() == outage.DEFAULT_PATIENCE
