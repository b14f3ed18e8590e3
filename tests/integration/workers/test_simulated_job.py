"""Simulated jobs (`polyrl.bench.simulation`): real runners, rollout workers and the trainer's
NATS side around modelled generation and training, on a real nats-server."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from polyrl.bench import simulation
from polyrl.local.natsserver import NatsServer
from polyrl.workers.runtime.simulation import LatencyModel, TrainCost

pytestmark = pytest.mark.slow

SETUP = simulation.Setup(
    model=LatencyModel(decode=0.01, median_tokens=16, tail=0.5),
    cost=TrainCost(fixed=0.2),
    compression=4.0,
    replicas=2,
    batch=32,
    group=4,
    requests_per_call=4,
    new_tokens=64,
    episodes_in_flight=16,
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulation.write_bundle(tmp_path_factory.mktemp("simulated") / "bundle")


async def run(
    url: str, bundle: Path, setup: simulation.Setup, steps: int
) -> simulation.SimulatedJob:
    job = simulation.SimulatedJob(url, setup)
    await job.start(bundle, steps=steps)
    try:
        await job.finished(timeout=60)
    finally:
        await job.stop()
    return job


async def test_in_sync_mode_every_step_trains_a_full_batch_of_its_own_version(
    nats_server: NatsServer, bundle: Path
) -> None:
    job = await run(nats_server.url, bundle, dataclasses.replace(SETUP, mode="sync"), 3)
    (trainer,) = job.trainers
    assert [r["step"] for r in trainer.records] == [1, 2, 3]
    assert all(r["samples"] == 32 for r in trainer.records)
    assert all(r["staleness"] == 0 for r in trainer.records)
    assert max(Counter(trainer.trained_ids).values()) == 1
    assert all(e.modelled > 0 for e in job.engines())
    assert [r.failed for r in job.runners] == [0]


async def test_in_async_mode_generation_runs_ahead_within_the_staleness_bound(
    nats_server: NatsServer, bundle: Path
) -> None:
    job = await run(nats_server.url, bundle, SETUP, 4)
    (trainer,) = job.trainers
    assert len(trainer.records) == 4
    assert all(r["samples"] == 32 for r in trainer.records)
    assert all(0 <= r["staleness"] <= 4 for r in trainer.records)
    assert max(Counter(trainer.trained_ids).values()) == 1
    # the replicas followed the announced versions
    assert all(w.weights.version >= 1 for w in job.rollouts["solver"])


async def test_three_policies_with_two_runners_all_reach_their_last_step(
    nats_server: NatsServer, bundle: Path
) -> None:
    setup = dataclasses.replace(SETUP, policies=("a", "b", "c"), runners=2, episodes_in_flight=24)
    job = await run(nats_server.url, bundle, setup, 2)
    assert [len(t.records) for t in job.trainers] == [2, 2, 2]
    assert all(w.served > 0 for workers in job.rollouts.values() for w in workers)
    assert len(job.runners) == 2
    assert job.trained() == 3 * 2 * 32
