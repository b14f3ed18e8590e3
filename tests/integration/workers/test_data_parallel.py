"""Data-parallel trainer ranks (gloo on CPU): same step as one rank, and a torchrun job.

The first test is the arithmetic of data parallelism: two ranks, each with half of a batch
and averaged gradients, must take the same optimizer step as one rank with all of it; so must
three, when `uniformGroups: skip` leaves too few samples for the third to have a share. The
second runs the trainer as pods run it, `torchrun --nproc-per-node=2 -m
polyrl.workers.trainer`, against a real nats-server, with a rollout worker and a workflow
runner in this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from polyrl.api import natsconfig
from polyrl.api.launch import CONFIG_ENV, Role, WorkerConfig
from polyrl.api.lora import LoraSpec
from polyrl.api.naming import JobNames
from polyrl.api.resources import EvalOn, RLJobSpec, Strategy
from polyrl.local import processes
from polyrl.local.natsserver import NatsServer
from polyrl.testing.waiting import wait_until_async
from polyrl.workers.rollout import main as rollout_main
from polyrl.workers.runner import main as runner_main
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.trainer import batching, checkpoint, learner, packing, ranks

pytestmark = pytest.mark.slow
BUDGET = 6  # tokens per packed micro-batch: one or two of the samples below


def job_spec(
    steps: int = 3, *, uniform_groups: str = "keep", lora: bool = False, packed: bool = False
) -> RLJobSpec:
    spec = RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://dp-test"},
                    "trainer": {
                        "batchSize": 8,
                        "microBatchSize": 8,
                        "nprocPerNode": 2,
                        "uniformGroups": uniform_groups,
                    },
                    "rollout": {"maxBatchSize": 16},
                }
            ],
            "workflow": {
                "name": "single",
                "episodesInFlight": 2,
                "task": {"name": "arithmetic", "params": {"digits": 1}},
            },
            "algorithm": {"groupSize": 4, "maxNewTokens": 3},
            "stop": {"steps": steps},
        }
    )
    if packed:  # micro-batches of about two samples each, packed, in two mini-batches
        spec.policies[0].trainer.micro_batch_tokens = BUDGET
        spec.policies[0].trainer.mini_batches = 2
    if lora:  # adapters on every linear layer, at a LoRA-sized learning rate
        spec.policies[0].trainer.lora = LoraSpec(rank=4)
        spec.policies[0].trainer.optimizer.lr = 1e-3
    return spec


def fixed_samples() -> list[batching.Sample]:
    """Two groups of uneven lengths and rewards: every rank's shard differs."""
    samples = []
    for i in range(8):
        n = 1 + i % 3
        samples.append(
            batching.Sample(
                prompt_ids=[1, 5 + i, 7],
                completion_ids=[9 + (i * j) % 11 for j in range(n)],
                behaviour_logprobs=[-2.0 - 0.1 * j for j in range(n)],
                reward=float(i % 2),
                group_id=f"g{i // 4}",
                weight_version=0,
            )
        )
    return samples


def few_to_train() -> list[batching.Sample]:
    """A group rewarded alike and two samples that differ: with `uniformGroups: skip`, two
    samples to train on, so a third rank has no share of the batch."""
    alike = [dataclasses.replace(s, reward=1.0) for s in fixed_samples()[:4]]
    return [*alike, *fixed_samples()[4:6]]


def one_step(
    rank: int,
    world: int,
    workdir: Path,
    init_file: Path,
    out: Path,
    skip: bool = False,
    lora: bool = False,
    packed: bool = False,
) -> None:
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
        )
    spec = job_spec(uniform_groups="skip" if skip else "keep", lora=lora, packed=packed)
    t = learner.Learner(spec.policies[0], spec.algorithm, workdir=workdir, rank=rank, world=world)
    t.sync_from_leader()
    t.step(few_to_train() if skip else fixed_samples())
    if rank == 0:
        torch.save({k: v.clone() for k, v in t.weights().items()}, out)
    if world > 1:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("world", "skip", "lora", "packed"),
    [
        (2, False, False, False),
        (3, True, False, False),
        (2, False, True, False),
        (3, False, False, True),
    ],
    ids=[
        "two-ranks",
        "three-ranks-one-without-a-share-of-the-skipped-batch",
        "two-ranks-training-lora-adapters",
        "three-ranks-packed-by-tokens-in-two-mini-batches-with-uneven-micro-batch-counts",
    ],
)
def test_ranks_take_the_same_step_as_one_rank_with_the_whole_batch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    world: int,
    skip: bool,
    lora: bool,
    packed: bool,
) -> None:
    # Spawned ranks unpickle `one_step` by importing this module: they need the repository
    # root on their path (the `pytest` script, unlike `python -m pytest`, does not add it).
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    models = tmp_path / "models"
    one_step(0, 1, models, tmp_path / "unused", tmp_path / "single.pt", skip, lora, packed)
    if packed:  # the ranks' shards of the first mini-batch need different micro-batch counts
        shards = [fixed_samples()[:4][r::world] for r in range(world)]
        lengths = [[len(s.prompt_ids) + len(s.completion_ids) for s in p] for p in shards]
        assert len({len(packing.by_tokens(n, BUDGET)) for n in lengths}) > 1
    mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
        one_step,
        args=(world, models, tmp_path / "init", tmp_path / "dp.pt", skip, lora, packed),
        nprocs=world,
        join=True,
    )
    single = torch.load(tmp_path / "single.pt")
    parallel = torch.load(tmp_path / "dp.pt")
    spec = job_spec(lora=lora)
    initial = learner.Learner(spec.policies[0], spec.algorithm, workdir=tmp_path / "models")
    before = initial.weights()
    moved = 0
    for name, tensor in single.items():
        torch.testing.assert_close(parallel[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
        moved += int(not torch.equal(tensor, before[name]))
    assert moved > 0  # the step did change the weights


def compare_at_the_end(rank: int, init_file: Path, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    said = []
    for nudge in (False, True):
        model = torch.nn.Linear(4, 2)
        torch.nn.init.constant_(model.weight, 0.5)
        torch.nn.init.zeros_(model.bias)
        if nudge and rank == 1:  # one bit of one weight differs
            model.weight.data[0, 0] = torch.nextafter(torch.tensor(0.5), torch.tensor(1.0))
        try:
            said.append(ranks.agree(7, model))
        except ranks.RanksDiverged as err:
            said.append(f"diverged: {err}")
    (out / f"rank{rank}.json").write_text(json.dumps(said))
    dist.destroy_process_group()


def test_ranks_compare_their_weights_when_training_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
        compare_at_the_end, args=(tmp_path / "init", tmp_path), nprocs=2, join=True
    )
    (same_0, apart_0), (same_1, apart_1) = (
        json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)
    )
    assert same_0 == same_1
    assert same_0.startswith("2 ranks agree: step 7, weights ")
    for apart in (apart_0, apart_1):  # one bit apart: both ranks refuse to go on
        assert apart.startswith("diverged: ranks ended apart"), apart


def sharded(spec: RLJobSpec) -> RLJobSpec:
    """fsdp2, with every phase rank 0 once ran alone: a warm-up, evaluations (through the
    pool), packed micro-batches in two mini-batches, and a KL anchor; checkpoints written in
    the background."""
    trainer = spec.policies[0].trainer
    trainer.strategy = Strategy.FSDP2
    trainer.checkpoint.async_writes = True
    trainer.warmup_steps, trainer.eval_every, trainer.eval_on = 2, 2, EvalOn.ROLLOUT
    trainer.micro_batch_tokens, trainer.mini_batches = BUDGET, 2
    spec.algorithm.kl_coef = 0.05
    return spec


def said_as_its_strategy_says(strategy: Strategy, log: str, lines: list[dict[str, Any]]) -> None:
    """The trainer's log and records: what each strategy publishes and each rank holds."""
    if strategy == Strategy.FSDP2:  # warmed up, evaluated at steps 0 and 2 through the pool
        assert "fsdp2: sharded over 2 ranks" in log
        # Warmed up on the shards, both ranks in step: after sharding, not before it.
        assert log.index("fsdp2: sharded over 2 ranks") < log.index("supervised warm-up:")
        assert "sharded checkpoint at step 3 written in the background" in log
        # Published from the shards: every version in two parts, put together by the rollout.
        assert "version 0 published in 2 parts: keyframe" in log
        assert "published in 2 parts: delta" in log
        assert [x["step"] for x in lines] == [0, 1, 2, 3]
        assert lines[0]["warmup_steps"] == 2
        assert [x["step"] for x in lines if "held_out" in x] == [0, 2]
    else:
        assert [x["step"] for x in lines] == [1, 2, 3]  # rank 0 alone reports
        assert "version 0 published: keyframe" in log
    first = next(x for x in lines if x["step"] == 1)  # what each rank holds, once
    held = [first["held_mib_rank0"], first["held_mib_rank1"]]
    assert min(held) > 0
    assert held[0] == pytest.approx(held[1], rel=0.1)  # whole on each, or a half each
    assert first["rss_gb_rank0"] > 0
    assert first["rss_gb_rank1"] > 0
    assert "rank 1 holds" in log


@pytest.mark.parametrize("strategy", [Strategy.DDP, Strategy.FSDP2])
async def test_a_torchrun_trainer_with_two_ranks_trains_and_its_rollouts_follow(
    nats_server: NatsServer, tmp_path: Path, strategy: Strategy
) -> None:
    names = JobNames(namespace="t", job=f"dp{uuid.uuid4().hex[:6]}")
    spec = job_spec(steps=3)
    if strategy == Strategy.FSDP2:
        spec = sharded(spec)
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver"])

    def config(role: Role) -> WorkerConfig:
        policy = None if role == Role.WORKFLOW else "solver"
        return WorkerConfig(
            namespace="t",
            job=names.job,
            role=role,
            policy=policy,
            nats_url=nats_server.url,
            spec=spec,
        )

    metrics = tmp_path / "metrics.jsonl"
    env = {
        **os.environ,
        CONFIG_ENV: config(Role.TRAINER).to_env(),
        "POLYRL_METRICS_FILE": str(metrics),
        "POLYRL_TRAINER_DIR": str(tmp_path / "trainers"),
        "OMP_NUM_THREADS": "1",
    }
    torchrun = Path(sys.executable).with_name("torchrun")
    argv = [str(torchrun), "--standalone", "--nnodes=1", "--nproc-per-node=2"]
    argv += ["-m", "polyrl.workers.trainer"]
    proc = processes.start("trainer", argv, log=tmp_path / "trainer.log", env=env)
    workers = [
        await Runtime.connect(config(Role.ROLLOUT), "rollout-0"),
        await Runtime.connect(config(Role.WORKFLOW), "workflow-0"),
    ]
    try:
        rollout = await rollout_main.build_rollout(workers[0], bundle_timeout=120)
        running = [
            asyncio.create_task(rollout.run()),
            asyncio.create_task(runner_main.build_workflow(workers[1]).run()),
        ]
        await wait_until_async(
            f"the trainer to exit (its log: {tmp_path / 'trainer.log'})",
            lambda: proc.popen is not None and proc.popen.poll() is not None,
            timeout=300,
            interval=0.5,
        )
        # The rollout worker applies new weights between batches, on its own schedule: the
        # trainer can publish version 1 and exit before that. Let it catch up while it runs
        # (unless the trainer failed: asserted below, with its log).
        await wait_until_async(
            "the rollout worker on version 1",
            lambda: rollout.engine.version >= 1 or proc.popen is None or proc.popen.returncode,
        )
        for rt in workers:
            rt.stopping.set()
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        processes.stop_all([proc], grace=10)
        for rt in workers:
            await rt.close()
        await nc.close()
    log = (tmp_path / "trainer.log").read_text()
    assert proc.popen is not None
    assert proc.popen.returncode == 0, log[-3000:]
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert "2 ranks agree: step 3" in log
    said_as_its_strategy_says(strategy, log, lines)
    assert rollout.engine.version >= 1
    ckpt = tmp_path / "trainers/t" / names.job / "solver/checkpoint" / checkpoint.STATE
    assert json.loads(ckpt.read_text())["step"] == 3
