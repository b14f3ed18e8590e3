"""Async mode's bound on how far generation runs ahead of training (`staleness.StalenessGate`)."""

from __future__ import annotations

import asyncio
import random

import pytest

from polyrl.testing.waiting import wait_until_async
from polyrl.workers.runner.staleness import StalenessGate


class Backlogs:
    """Each policy's unacknowledged trajectories, as the test sets them."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.reads = 0  # how often the gate looked

    async def __call__(self, policy: str) -> int:
        self.reads += 1
        return self.now.get(policy, 0)

    async def read_twice_more(self) -> None:
        """Until the gate has read the backlog twice after now: a waiter that was going to
        go on what it reads has gone on by then."""
        target = self.reads + 2
        await wait_until_async("two more reads of the backlog", lambda: self.reads >= target)


def gate(backlogs: Backlogs, *, max_staleness: int = 1, runners: int = 1) -> StalenessGate:
    return StalenessGate(
        {"solver": 256, "verifier": 128},
        max_staleness=max_staleness,
        backlog=backlogs,
        runners=runners,
        poll=0.005,
    )


async def test_a_policy_is_asked_while_its_queue_fits_max_staleness_plus_one_batches() -> None:
    backlogs = Backlogs()
    made = gate(backlogs, max_staleness=1)
    for _ in range(64):  # 64 requests of 8 in flight: two batches
        await asyncio.wait_for(made.reserve("solver", 8), 1)
    assert not made.has_room("solver", 8)
    assert made.has_room("verifier", 8)  # each policy has its own allowance
    for _ in range(64):  # the answers came: now they wait in the trainer's stream
        made.answered("solver", 8)
    backlogs.now["solver"] = 512
    waiting = asyncio.create_task(made.reserve("solver", 8))
    await backlogs.read_twice_more()
    assert not waiting.done()  # the trainer has not taken a batch yet
    backlogs.now["solver"] = 256  # it acknowledged one
    await asyncio.wait_for(waiting, 1)
    assert made.in_flight["solver"] == 8
    assert made.waited > 0


async def test_several_runners_count_the_shared_backlog_by_their_share() -> None:
    backlogs = Backlogs()
    backlogs.now["solver"] = 1000
    alone, shared = gate(backlogs, runners=1), gate(backlogs, runners=4)
    await asyncio.wait_for(shared.reserve("solver", 8), 1)  # 1000 / 4 + 8 <= 512
    assert alone.has_room("solver", 8) is True  # nothing read yet
    task = asyncio.create_task(alone.reserve("solver", 8))  # 1000 + 8 > 512
    await backlogs.read_twice_more()
    assert not task.done()
    task.cancel()


async def test_a_finished_policy_or_one_not_trained_here_is_never_waited_for() -> None:
    backlogs = Backlogs()
    backlogs.now["verifier"] = 10_000
    made = gate(backlogs, max_staleness=0)
    made.finished = {"verifier"}  # its trainer will not catch up
    await asyncio.wait_for(made.reserve("verifier", 8), 1)
    await asyncio.wait_for(made.reserve("judge", 1000), 1)  # no trainer of its own here


async def test_a_request_larger_than_the_allowance_goes_once_nothing_is_queued() -> None:
    made = gate(Backlogs(), max_staleness=0)
    await asyncio.wait_for(made.reserve("verifier", 300), 1)
    assert not made.has_room("verifier", 1)
    made.answered("verifier", 300)
    assert not made.has_room("verifier", 1)  # on their way into the trainer's stream
    await asyncio.sleep(0.01)
    await asyncio.wait_for(made.reserve("verifier", 300), 1)  # the trainer took them all


@pytest.mark.parametrize(
    ("max_staleness", "drop", "emit"), [(0, 0.0, 1.0), (1, 0.1, 1.0), (3, 0.0, 0.5)]
)
async def test_a_trainer_never_trains_a_sample_more_than_the_bound_late_and_never_starves(
    max_staleness: int, drop: float, emit: float
) -> None:
    """Simulate the loop: requests answered at the trainer's current version, a share of the
    answers emitted (a workflow may emit fewer samples than it asked for), the trainer taking
    batches in order and dropping some samples. Whatever is lost, the trainer gets its six
    batches (no deadlock), and no sample is trained more than the bound after it was asked."""
    backlogs = Backlogs()
    made = gate(backlogs, max_staleness=max_staleness)
    queue: list[int] = []  # the versions at which the queued samples were asked for
    version = 0
    ages: list[int] = []
    rng = random.Random(0)

    async def generate() -> None:
        while version < 6:
            await made.reserve("solver", 8)
            asked = version
            await asyncio.sleep(0)
            made.answered("solver", 8)
            queue.extend(asked for _ in range(8) if rng.random() < emit)
            backlogs.now["solver"] = len(queue)

    async def train() -> None:
        nonlocal version
        while version < 6:
            kept = [v for v in queue[:256] if rng.random() >= drop]
            if len(queue) < 256:
                await asyncio.sleep(0.001)
                continue
            ages.extend(version - v for v in kept)
            await asyncio.sleep(0.002)  # the step; the batch stays unacknowledged
            del queue[:256]
            backlogs.now["solver"] = len(queue)
            version += 1

    await asyncio.wait_for(asyncio.gather(generate(), train()), 20)
    assert version == 6
    assert 0 <= max(ages) <= max_staleness


async def test_refresh_shows_room_again_for_a_policy_nobody_asks_while_it_has_none() -> None:
    """The runner skips a policy without room, so `reserve` never reads its backlog: `refresh`
    must, or the policy would stay without room for good."""
    backlogs = Backlogs()
    made = gate(backlogs, max_staleness=0)
    backlogs.now["verifier"] = 128
    await made.refresh()
    assert not made.has_room("verifier")
    backlogs.now["verifier"] = 0  # its trainer took the batch
    await asyncio.sleep(0.01)
    await made.refresh()
    assert made.has_room("verifier")


def test_a_request_needs_the_version_its_batch_is_trained_from_less_the_bound() -> None:
    """The trainer trains from version 7; a sample lands in the batch after what is queued."""
    made = gate(Backlogs(), max_staleness=1)
    made.versions = {"solver": 7}
    assert made.min_version("solver") == 6  # into the batch trained from 7
    made.in_flight["solver"] = 255
    assert made.min_version("solver") == 6
    made.in_flight["solver"] = 256
    assert made.min_version("solver") == 7  # into the next, trained from 8
    made.finished = {"solver"}
    assert made.min_version("solver") == 0  # its trainer will not catch up: no bound
    assert made.min_version("judge") == 0  # not trained here
    assert made.min_version("verifier") == 0  # no heartbeat of its trainer yet


@pytest.mark.parametrize("bounded", [True, False])
async def test_with_publication_lag_only_requests_for_the_version_under_way_keep_samples_fresh(
    bounded: bool,
) -> None:
    """The rollout worker serves the trainer's previous version while its newest is being
    published. Asked for samples of the last batch the bound allows, it makes samples one
    version too old, which the trainer drops, unless the request waits for the version its
    batch needs (`min_version`, `bounded`); then nothing is dropped and the trainer still gets
    its batches."""
    backlogs = Backlogs()
    made = gate(backlogs, max_staleness=1)
    versions = {"solver": 0}
    made.versions = versions
    queue: list[int] = []
    served = 0  # the version the rollout worker has
    landed = asyncio.Condition()
    dropped = trained = 0

    async def generate() -> None:
        while versions["solver"] < 8:
            oldest = await made.reserve("solver", 8)
            if bounded:  # held back until the version lands
                async with landed:
                    await landed.wait_for(lambda oldest=oldest: served >= oldest)  # type: ignore[misc]
            asked = served
            await asyncio.sleep(0)  # generation, faster than training
            made.answered("solver", 8)
            queue.extend([asked] * 8)
            backlogs.now["solver"] = len(queue)

    async def publish(version: int) -> None:
        nonlocal served
        await asyncio.sleep(0.03)
        async with landed:
            served = version
            landed.notify_all()

    async def train() -> None:
        nonlocal dropped, trained
        publications = []
        while versions["solver"] < 8:
            if len(queue) < 256:
                await asyncio.sleep(0.001)
                continue
            batch = queue[:256]
            fresh = [v for v in batch if versions["solver"] - v <= 1]
            dropped += len(batch) - len(fresh)
            trained += len(fresh)
            await asyncio.sleep(0.05)  # the step
            versions["solver"] += 1  # its heartbeat, then the acknowledgement
            publications.append(asyncio.create_task(publish(versions["solver"])))
            del queue[:256]
            backlogs.now["solver"] = len(queue)
        await asyncio.gather(*publications)

    await asyncio.wait_for(asyncio.gather(generate(), train()), 30)
    assert trained > 0
    if bounded:
        assert dropped == 0
    else:
        assert dropped > 0  # what the bound on the queue alone let through
