"""Mutated messages on the subjects the workflow runner and the trainer read (the rollout
worker's requests are fuzzed in test_rollout_worker.py): each malformed one is dead-lettered
and counted, the rest are used or ignored, and no worker stops.

The mutants come from `tests.fuzzing` (hypothesis, derandomised); the wire models decide
which are malformed. Everything talks over the session's real nats-server.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient
from tests import fuzzing
from tests.integration.workers.test_workflow_runner import spec

from polyrl.api import natsconfig
from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.messages import WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.wire import Completion, GenerationResponse, Trajectory
from polyrl.local.natsserver import NatsServer
from polyrl.testing.waiting import wait_until_async
from polyrl.workers.runner import main as runner_main
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.trainer import intake as trainer

pytestmark = pytest.mark.slow


@pytest.fixture
async def job(nats_server: NatsServer) -> AsyncIterator[tuple[NatsClient, JobNames]]:
    names = JobNames(namespace="t", job=f"fz{uuid.uuid4().hex[:6]}")
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver"])
    yield nc, names
    await natsconfig.remove(nc.jetstream(), names, ["solver"])
    await nc.close()


async def connect(url: str, names: JobNames, role: Role) -> Runtime:
    policy = None if role == Role.WORKFLOW else "solver"
    config = WorkerConfig(
        namespace="t", job=names.job, role=role, policy=policy, nats_url=url, spec=spec("single")
    )
    return await Runtime.connect(config, f"{role}-0")


async def test_fuzzed_replies_to_the_workflow_runner_are_dead_lettered_and_it_runs_on(
    job: tuple[NatsClient, JobNames], nats_server: NatsServer
) -> None:
    nc, names = job
    rt = await connect(nats_server.url, names, Role.WORKFLOW)
    runner = runner_main.build_workflow(rt)
    runner.drain_timeout = 1.0  # its episodes wait for rollouts this test does not start
    running = asyncio.create_task(runner.run())
    valid = GenerationResponse(
        id="r-1",
        pod="rollout-0",
        weight_version=0,
        prompt_tokens=[1, 2, 3],
        completions=[Completion(tokens=[4], logprobs=[-0.5], text="4", finish_reason="stop")],
    ).model_dump(mode="json")
    messages = fuzzing.examples(fuzzing.mutants(valid), 300)
    expected = sum(fuzzing.malformed(GenerationResponse, m) for m in messages)
    try:
        await wait_until_async(
            "the runner connected and serving",
            lambda: bool(rt.nc.is_connected) and runner.rt.state == WorkerState.SERVING,
            timeout=60,
        )
        for message in messages:
            await nc.publish(runner.generation.inbox, message)
        await wait_until_async(
            f"{expected} dead letters", lambda: rt.dead_letters >= expected, timeout=60
        )
        assert rt.dead_letters == expected
        assert expected >= len(messages) // 2
        assert not running.done()
    finally:
        rt.stopping.set()
        await asyncio.wait_for(running, timeout=60)
        await rt.close()


async def test_fuzzed_trajectories_are_dead_lettered_and_the_trainer_keeps_the_valid_ones(
    job: tuple[NatsClient, JobNames], nats_server: NatsServer
) -> None:
    nc, names = job
    rt = await connect(nats_server.url, names, Role.TRAINER)
    valid = Trajectory(
        id="t-1",
        episode_id="e",
        group_id="g",
        policy="solver",
        prompt_tokens=[1, 2],
        tokens=[3, 4],
        logprobs=[-0.1, -0.2],
        reward=1.0,
        weight_version=0,
        created_at=time.time(),
    ).model_dump(mode="json")
    messages = fuzzing.examples(fuzzing.mutants(valid), 300)
    good = [m for m in messages if not fuzzing.malformed(Trajectory, m)]
    sentinel = Trajectory.model_validate(valid).model_copy(update={"id": "last"})
    js = nc.jetstream()
    for message in [*messages, sentinel.model_dump_json().encode()]:
        subject = names.trajectories_subject("solver")
        await js.publish(subject, message, headers={"Nats-Msg-Id": uuid.uuid4().hex})
    sub = await rt.js.pull_subscribe(
        names.trajectories_subject("solver"),
        durable=JobNames.trainer_consumer,
        stream=names.trajectories_stream("solver"),
    )
    try:
        kept, _, stale = await asyncio.wait_for(
            trainer.pull_batch(rt, sub, len(good) + 1, version=0, max_staleness=10**6),
            timeout=60,
        )
    finally:
        await rt.close()
    assert stale == []
    assert [t.id for t in kept][-1] == "last"  # every message before it was read
    assert len(kept) == len(good) + 1
    assert rt.dead_letters == len(messages) - len(good)
    assert rt.dead_letters >= len(messages) // 2
