"""The one way tests (and the benchmarks) wait for a state: poll until it holds, or fail.

A test that sleeps a fixed time and then checks assumes the state came within that time; on
a slow or busy machine it did not, and the check either fails for no reason or, where it
checks that nothing happened, passes without having looked. `wait_until` polls a probe until
it returns something truthy and returns that; past the timeout it fails naming what was
awaited and the last value the probe gave, which is usually what a red run needs.
`wait_until_async` is the same for tests on an event loop, whose probe may be a coroutine
function and whose pauses let the loop run.

It lives in `polyrl.testing`, not under `tests/`, because the benchmarks wait the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def wait_until(
    what: str, probe: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.2
) -> T:
    """Poll `probe` until it returns something truthy, and return that; fail naming `what`
    and the last value after `timeout` seconds. The probe runs at least once."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(what, timeout, last))
        time.sleep(interval)


@overload
async def wait_until_async(
    what: str,
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
) -> T: ...


@overload
async def wait_until_async(
    what: str, probe: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.05
) -> T: ...


async def wait_until_async(
    what: str,
    probe: Callable[[], Any],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
) -> Any:
    """`wait_until` on the running event loop: `probe` may be a plain or a coroutine
    function; between tries the loop runs the rest of the test's tasks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        last = probe()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if loop.time() >= deadline:
            raise AssertionError(_timed_out(what, timeout, last))
        await asyncio.sleep(interval)


def _timed_out(what: str, timeout: float, last: object) -> str:
    return f"timed out after {timeout:g}s waiting for {what} (last: {last!r})"
