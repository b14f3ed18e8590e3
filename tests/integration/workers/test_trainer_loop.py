"""The whole data plane in one process: trainer, rollout worker, workflow runner over NATS.

Short runs: the point is the plumbing (bundle, versions, deltas, trajectories, acks,
checkpoints, epochs), not learning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
import torch

from polyrl.api import natsconfig
from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.lora import LoraSpec, LoraSync
from polyrl.api.naming import JobNames
from polyrl.api.resources import RLJobSpec
from polyrl.local.natsserver import NatsServer
from polyrl.testing.waiting import wait_until_async
from polyrl.workers import preflight
from polyrl.workers.models.adapters import Adapter
from polyrl.workers.rollout import main as rollout_main
from polyrl.workers.runner import main as runner_main
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.trainer import checkpoint, learner, loop
from polyrl.workers.weightsync import announce
from polyrl.workers.weightsync.store import WeightStore

pytestmark = pytest.mark.slow


def spec(steps: int, mode: str = "async") -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://loop-test"},
                    "trainer": {"batchSize": 8, "microBatchSize": 8, "checkpointEvery": 2},
                    "rollout": {"maxBatchSize": 16},
                    "keyframeEvery": 2,
                }
            ],
            "workflow": {
                "name": "single",
                "episodesInFlight": 2,
                "task": {"name": "arithmetic", "params": {"digits": 1}},
            },
            "algorithm": {"mode": mode, "groupSize": 4, "maxNewTokens": 3, "maxStaleness": 4},
            "stop": {"steps": steps},
        }
    )


async def run_trainer(
    nats_url: str, names: JobNames, job: RLJobSpec, workdir: Path
) -> learner.Learner:
    config = WorkerConfig(
        namespace=names.namespace,
        job=names.job,
        role=Role.TRAINER,
        policy="solver",
        nats_url=nats_url,
        spec=job,
    )
    # Built off the event loop: the model takes seconds, and the other workers this test runs
    # on the same loop have NATS requests in flight with a 5 s timeout meanwhile.
    t = await asyncio.to_thread(learner.Learner, job.policies[0], job.algorithm, workdir=workdir)
    rt = await Runtime.connect(config, "trainer-0")
    try:
        await loop.run(rt, t, preflight.roles(job)["solver"])
    finally:
        await rt.close()
    return t


@dataclasses.dataclass
class Served:
    """A job's trainer run to its end, with a rollout worker and a workflow runner beside it."""

    trainer: learner.Learner
    rollout: Any
    runtimes: tuple[Runtime, Runtime]


async def train_and_serve(nats_url: str, names: JobNames, job: RLJobSpec, workdir: Path) -> Served:
    training = asyncio.create_task(run_trainer(nats_url, names, job, workdir))
    rollout_rt = await Runtime.connect(
        WorkerConfig(
            namespace=names.namespace,
            job=names.job,
            role=Role.ROLLOUT,
            policy="solver",
            nats_url=nats_url,
            spec=job,
        ),
        "rollout-0",
    )
    rollout = await rollout_main.build_rollout(rollout_rt, bundle_timeout=60)
    serving = asyncio.create_task(rollout.run())
    runner_rt = await Runtime.connect(
        WorkerConfig(
            namespace=names.namespace,
            job=names.job,
            role=Role.WORKFLOW,
            nats_url=nats_url,
            spec=job,
        ),
        "workflow-0",
    )
    episodes = asyncio.create_task(runner_main.build_workflow(runner_rt).run())
    try:
        trained = await asyncio.wait_for(training, timeout=300)
        # The rollout worker applies new weights between batches, on its own schedule: the
        # trainer can publish its last version and finish before that. Let it catch up while
        # it runs: once it is stopped, it applies nothing more.
        last = trained.state.version
        await wait_until_async(
            f"the rollout worker on version {last}", lambda: rollout.engine.version >= last
        )
    finally:
        for rt in (rollout_rt, runner_rt):
            rt.stopping.set()
        await asyncio.gather(serving, episodes, return_exceptions=True)
    return Served(trained, rollout, (rollout_rt, runner_rt))


async def test_trainer_steps_publish_versions_that_rollouts_serve_and_resume_in_a_new_epoch(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("POLYRL_METRICS_FILE", str(metrics))
    names = JobNames(namespace="t", job=f"loop{uuid.uuid4().hex[:6]}")
    job = spec(steps=3)
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver"])
    served = await train_and_serve(nats_server.url, names, job, tmp_path / "tr")
    first, rollout = served.trainer, served.rollout
    rollout_rt, runner_rt = served.runtimes
    assert first.state.step == 3
    assert first.state.version == 3  # v0 at start, one per step
    latest = await announce.latest(nc.jetstream(), names, "solver")
    assert latest is not None
    assert (latest.version, latest.epoch) == (3, 0)
    assert latest.final  # its stop condition: workflows stop asking for its samples
    assert rollout.engine.version >= 1  # the rollout worker followed the trainer
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert all("loss" in x and "reward" in x for x in lines)
    assert (tmp_path / "tr" / "checkpoint" / checkpoint.STATE).is_file()

    # A restarted trainer resumes from its checkpoint in a new epoch, after version 3.
    resumed = learner.Learner(job.policies[0], job.algorithm, workdir=tmp_path / "tr")
    assert (resumed.state.step, resumed.state.epoch) == (3, 1)
    await rollout_rt.close()
    await runner_rt.close()
    await nc.close()


async def test_sync_mode_trains_each_step_only_on_samples_of_the_current_weights(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("POLYRL_METRICS_FILE", str(metrics))
    names = JobNames(namespace="t", job=f"sync{uuid.uuid4().hex[:6]}")
    job = spec(steps=3, mode="sync")
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver"])
    training = asyncio.create_task(run_trainer(nats_server.url, names, job, tmp_path / "tr"))
    workers = []
    for role, pod in ((Role.ROLLOUT, "rollout-0"), (Role.WORKFLOW, "workflow-0")):
        config = WorkerConfig(
            namespace="t",
            job=names.job,
            role=role,
            policy="solver" if role == Role.ROLLOUT else None,
            nats_url=nats_server.url,
            spec=job,
        )
        workers.append(await Runtime.connect(config, pod))
    rollout = await rollout_main.build_rollout(workers[0], bundle_timeout=60)
    runner = runner_main.build_workflow(workers[1])
    running = [asyncio.create_task(rollout.run()), asyncio.create_task(runner.run())]
    try:
        await asyncio.wait_for(training, timeout=300)
    finally:
        for rt in workers:
            rt.stopping.set()
        await asyncio.gather(*running, return_exceptions=True)
        for rt in workers:
            await rt.close()
        await nc.close()
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    # Every sample of every step came from the weights being trained, and none was wasted:
    # a round is exactly one batch (2 episodes x 4 samples).
    assert all(x["staleness"] == 0 and x["stale_dropped"] == 0 for x in lines), lines
    assert all(x["staleness_0"] == 1.0 for x in lines), lines  # every sample of age 0
    gate = runner.admission.gate
    assert gate is not None
    assert gate.rounds >= 3
    assert gate.waited > 0  # the runner did wait for each step's weights


async def lora_served(
    nats_server: NatsServer, tmp_path: Path, lora_spec: LoraSpec
) -> tuple[Served, Any, JobNames]:
    """Three LoRA steps (lr 1e-3) served by a rollout worker that has reached version 3.

    Rewarded by `dense_task`, so that the steps change the adapter: arithmetic's rewards
    are all 0 for the untrained model, and an untouched adapter would pass any check of it."""
    names = JobNames(namespace="t", job=f"lora{uuid.uuid4().hex[:6]}")
    job = spec(steps=3)
    job.workflow.task.name = "tests.integration.workers.dense_task:make"
    job.policies[0].trainer.lora = lora_spec
    job.policies[0].trainer.optimizer.lr = 1e-3
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver"])
    served = await train_and_serve(nats_server.url, names, job, tmp_path / "tr")
    engine = served.rollout.engine
    await wait_until_async("the rollout worker on version 3", lambda: engine.version == 3)
    return served, nc, names


async def test_a_lora_trainer_publishes_merged_weights_that_rollouts_serve_bit_exact(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    served, nc, _ = await lora_served(nats_server, tmp_path, LoraSpec(rank=4, sync=LoraSync.MERGED))
    engine = served.rollout.engine
    merged, serving = served.trainer.bf16(), engine.weights()
    assert merged.keys() == serving.keys()  # the base's own names: no adapter in sight
    assert any(not torch.equal(v, served.trainer.base_bf16()[k]) for k, v in merged.items())
    assert all(torch.equal(serving[k], v) for k, v in merged.items())
    assert (tmp_path / "tr" / "checkpoint" / checkpoint.ADAPTER_WEIGHTS).is_file()
    for rt in served.runtimes:
        await rt.close()
    await nc.close()


async def test_a_lora_trainer_sends_the_base_once_then_adapters_that_rollouts_serve_merged(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sync: adapter`: the bucket holds the frozen base once and a chain of adapter objects
    (keyframes and deltas, megabytes against the model's size); the rollout engine holds the
    trainer's base and serves it merged with the latest adapter, bit for bit as the adapter
    merge computes it; each version's bytes and kind are in metrics.jsonl."""
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("POLYRL_METRICS_FILE", str(metrics))
    lora_spec = LoraSpec(rank=4)
    served, nc, names = await lora_served(nats_server, tmp_path, lora_spec)
    engine = served.rollout.engine
    trainer = served.trainer
    base, adapter = trainer.base_bf16(), Adapter(trainer.published(), lora_spec.scale_alpha)
    serving = engine.weights()
    assert serving.keys() == base.keys()
    assert all(bool(b.any()) for _, b in adapter.pairs.values())  # B starts at 0: it trained
    for name, weight in base.items():
        expected = adapter.merged(name, weight) if name in adapter.pairs else weight
        assert torch.equal(serving[name], expected.to(serving[name].dtype)), name
    store = await WeightStore.open(nc.jetstream(), names.weights_bucket("solver"))
    sizes = await store.sizes()
    chain_sizes = [size for name, size in sizes.items() if name != announce.BASE_OBJECT]
    assert chain_sizes
    assert max(chain_sizes) * 10 < sizes[announce.BASE_OBJECT]
    latest = await announce.latest(nc.jetstream(), names, "solver")
    assert latest is not None
    assert latest.payload == announce.Payload.ADAPTER
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    kinds = {x["published_kind"] for x in lines if "published_kind" in x}
    assert kinds
    assert all(set(kind.split("+")) <= {"adapter", "adapter-delta"} for kind in kinds)
    assert all(
        x["published_bytes"] <= max(chain_sizes) * 2 for x in lines if "published_bytes" in x
    )
    for rt in served.runtimes:
        await rt.close()
    await nc.close()
