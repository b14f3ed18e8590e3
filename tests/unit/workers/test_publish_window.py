"""The runner's publish window: publishes run concurrently up to its size, a failure is raised
at the next submit or at the flush, and a flush waits for every publish in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from polyrl.workers.runtime.window import PublishWindow


async def test_publishes_overlap_up_to_the_window_and_the_sender_waits_beyond_it() -> None:
    window = PublishWindow(size=3)
    gate = asyncio.Event()
    started: list[int] = []

    def publish(i: int) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            started.append(i)
            await gate.wait()

        return go

    for i in range(3):
        await window.submit(publish(i))
    await asyncio.sleep(0)
    assert window.in_flight == 3
    fourth = asyncio.create_task(window.submit(publish(3)))
    await asyncio.sleep(0.05)
    assert not fourth.done()  # the window is full: the sender waits
    gate.set()
    await fourth
    await window.flush()
    assert sorted(started) == [0, 1, 2, 3]
    assert (window.in_flight, window.published) == (0, 4)


async def test_a_publish_that_failed_is_told_at_once_and_raised_at_the_next_submit_and_flush() -> (
    None
):
    heard: list[Exception] = []
    window = PublishWindow(size=4, on_error=heard.append)

    async def fails() -> None:
        raise ConnectionError("NATS did not come back for trajectory e/0")

    async def works() -> None:
        await asyncio.sleep(0.01)

    await window.submit(works)
    await window.submit(fails)
    with pytest.raises(ConnectionError, match="trajectory e/0"):
        await window.flush()  # after the one that worked
    assert window.published == 1
    assert [str(e) for e in heard] == ["NATS did not come back for trajectory e/0"]  # at once
    with pytest.raises(ConnectionError):
        await window.submit(works)  # nothing more goes out after a loss


def test_a_window_holds_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PublishWindow(size=0)
