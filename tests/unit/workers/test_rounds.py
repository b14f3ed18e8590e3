"""Sync mode's round gate: one batch per round, then wait for every policy's new weights."""

from __future__ import annotations

import asyncio

import pytest

from polyrl.testing.waiting import wait_until_async
from polyrl.workers.runner.rounds import RoundGate, per_runner_need


class Announcements:
    """Stands in for the weight announcements on NATS: the latest version of each policy."""

    def __init__(self, **versions: int) -> None:
        self.versions = dict(versions)
        self.reads = 0  # how often the gate looked

    async def __call__(self) -> dict[str, int]:
        self.reads += 1
        return dict(self.versions)


async def admitted_within(gate: RoundGate, seconds: float = 0.2) -> bool:
    try:
        await asyncio.wait_for(gate.admit(), timeout=seconds)
    except TimeoutError:
        return False
    return True


async def test_a_round_admits_just_enough_episodes_for_each_policys_batch() -> None:
    latest = Announcements(solver=0, verifier=0)
    gate = RoundGate({"solver": 32, "verifier": 32}, latest, poll=0.01)
    assert await admitted_within(gate)
    # The yield of an episode is not known yet: no second episode until the first is done.
    assert not await admitted_within(gate)
    await gate.done({"solver": 8, "verifier": 64})
    admitted = 0
    while await admitted_within(gate, 0.05):
        admitted += 1
    assert admitted == 3  # 8 emitted + 3 in flight x 8 = 32 solver samples
    assert gate.min_version("solver") == 0


async def test_the_next_round_starts_once_every_policy_announced_new_weights() -> None:
    latest = Announcements(solver=0, verifier=0)
    gate = RoundGate({"solver": 8, "verifier": 8}, latest, poll=0.01)
    await gate.admit()
    await gate.done({"solver": 8, "verifier": 64})
    waiter = asyncio.create_task(gate.admit())
    await asyncio.sleep(0.1)
    latest.versions["solver"] = 1
    await asyncio.sleep(0.1)  # time the waiter waits, which `waited` must count
    seen = latest.reads + 2  # and it has seen the solver's new version
    await wait_until_async("two more reads of the announcements", lambda: latest.reads >= seen)
    assert not waiter.done()  # the verifier has not moved on yet
    latest.versions["verifier"] = 3
    await asyncio.wait_for(waiter, timeout=1.0)
    assert (gate.min_version("solver"), gate.min_version("verifier")) == (1, 3)
    assert gate.rounds == 2
    # The gate starts its clock a loop turn after the test starts its first 0.1 s sleep, and
    # it may see the last announcement in the same turn the test makes it: no margin at 0.2.
    assert gate.waited >= 0.15


async def test_a_round_that_falls_short_is_run_again_at_the_same_versions() -> None:
    latest = Announcements(solver=4)
    gate = RoundGate({"solver": 8}, latest, round_timeout=0.2, poll=0.01)
    await gate.admit()
    await gate.done({"solver": 8})  # the trainer lost it somehow: no version 5 comes
    await asyncio.wait_for(gate.admit(), timeout=2.0)
    assert gate.rounds == 2
    assert gate.min_version("solver") == 4


async def test_a_failed_episode_frees_its_place_without_counting_samples() -> None:
    gate = RoundGate({"solver": 16}, Announcements(solver=0), poll=0.01)
    await gate.admit()
    await gate.done({})  # failed before emitting anything
    assert await admitted_within(gate)
    assert gate.yields is None


@pytest.mark.parametrize(("replicas", "expected"), [(1, {"a": 32, "b": 5}), (3, {"a": 11, "b": 2})])
def test_each_workflow_runner_covers_its_share_of_a_batch(
    replicas: int, expected: dict[str, int]
) -> None:
    assert per_runner_need({"a": 32, "b": 5}, replicas) == expected
