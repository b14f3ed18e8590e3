"""`trainer.strategy: fsdp2` against data-parallel, on 2 CPU ranks (gloo, float32).

From the same start, with the same per-rank sample split, both strategies must take the
same steps: losses and weights within 1e-5 after 5 steps. Sharded, each rank holds about
half of the parameters, gradients and AdamW state. A sharded trainer's checkpoint resumes on
another number of ranks (2 -> 1 and 1 -> 2): the next step's loss is the uninterrupted run's.
Each version the sharded ranks publish in parts (each its rows, handed to rank 0 over gloo)
is, once a replica puts it together from NATS, bit for bit the bf16 weights a data-parallel
trainer publishes for the same weights.
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
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from polyrl.api import natsconfig
from polyrl.api.naming import JobNames
from polyrl.api.resources import RLJobSpec, Strategy
from polyrl.local.natsserver import NatsServer
from polyrl.workers import export
from polyrl.workers.trainer import (
    batching,
    checkpoint,
    learner,
    sharded_checkpoint,
    sharding,
    warmup,
)
from polyrl.workers.weightsync import chain
from polyrl.workers.weightsync.sync import WeightSync

from .test_data_parallel import fixed_samples, job_spec
from .test_weight_sync import POLICY, weights_only

pytestmark = pytest.mark.slow
STEPS = 5
SAVED_AT = 3  # the sharded run's checkpoint: resumed on another number of ranks
PROMPTS = ["12 + 7 =", "3 + 4 =", "the answer is"]


def spec(strategy: Strategy) -> RLJobSpec:
    """Token-budget micro-batches in two mini-batches, and a KL anchor (sharded too)."""
    job = job_spec(packed=True)
    job.policies[0].trainer.strategy = strategy
    job.policies[0].trainer.optimizer.lr = 1e-3  # steps that move the weights visibly
    job.algorithm.kl_coef = 0.1
    job.policies[0].keyframe_every = 3  # parts of keyframes 0 and 3 and of every delta
    # Sharded checkpoints are written in the background while the next steps train: the
    # resumed runs below read what the ranks held when they saved, not what came after.
    job.policies[0].trainer.checkpoint.async_writes = strategy == Strategy.FSDP2
    return job


def batch(step: int) -> list[batching.Sample]:
    """A different batch each step: the rewards rotate."""
    samples = fixed_samples()
    rewards = [s.reward for s in samples]
    rewards = rewards[step % len(rewards) :] + rewards[: step % len(rewards)]
    return [dataclasses.replace(s, reward=r) for s, r in zip(samples, rewards, strict=True)]


def bytes_held(t: learner.Learner) -> dict[str, int]:
    return sharding.held_bytes(t.model, t.optimizer) | {
        "largest_layer": max(
            sum(p.numel() * p.element_size() for p in layer.parameters())
            for layer in sharding.decoder_layers(t.model)
        ),
    }


def train(
    rank: int, world: int, strategy: str, workdir: Path, out: Path, first: int, save_after: int
) -> None:
    """Steps `first`..STEPS-1 on `world` ranks, resuming from `workdir`'s checkpoint if it
    has one; saves one once `save_after` steps are done (into `workdir/saved`); writes its
    figures."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}.init", rank=rank, world_size=world)
    job = spec(Strategy(strategy))
    t = learner.Learner(job.policies[0], job.algorithm, workdir=workdir, rank=rank, world=world)
    t.sync_from_leader()
    parts = Path(f"{out}.parts") if strategy == Strategy.FSDP2 and first == 0 else None
    if parts is not None:
        publish_parts(t, rank, world, 0, parts)
    losses = []
    for step in range(first, STEPS):
        losses.append(t.step(batch(step))["loss"])
        if parts is not None:
            publish_parts(t, rank, world, step + 1, parts)
        if step + 1 == save_after:
            t.checkpoint_dir = workdir / "saved" / "checkpoint"
            t.save()
    t.saved()  # a checkpoint written in the background lands
    held = bytes_held(t)
    # Greedy decoding on the trained weights: sharded, both ranks decode in step (each
    # forward gathers from both), as the warm-up's checks and the solver's exam do.
    completions = warmup.greedy_completions(t.model, t.tokenizer, PROMPTS, 6)
    weights = t.weights()  # every rank gathers
    mean = [0.0] * len(losses)
    for i, loss in enumerate(losses):
        total = torch.tensor(loss, dtype=torch.float64)
        dist.all_reduce(total)
        mean[i] = float(total) / world  # each rank's loss is its share over world ranks
    if rank == 0:
        torch.save(weights, f"{out}.pt")
        figures = {"losses": mean, "bytes": held, "completions": completions}
        Path(f"{out}.json").write_text(json.dumps(figures))
    dist.barrier()  # leave together: a rank torn down while its peer still works aborts
    dist.destroy_process_group()


def publish_parts(t: learner.Learner, rank: int, world: int, version: int, out: Path) -> None:
    """Every rank encodes its rows of `version`; rank 0 receives the others' parts in turn
    and writes each under its object name (what the trainer puts into the bucket)."""
    mine = t.publish_part(version)
    if rank != 0:
        return
    assert t.parts is not None
    out.mkdir(exist_ok=True)
    for part in mine:
        for r in range(world):
            blob = part.blob if r == 0 else t.parts.receive(r)
            (out / chain.part_name(part.name, r, world)).write_bytes(bytes(blob))


def read_all(folder: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted(folder.iterdir())}


async def replicas_of(url: str, parts: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parts through a real bucket: one replica follows every version's delta from
    version 0, a new one starts from the latest keyframe; both states."""
    nc = await nats.connect(url)
    names = JobNames(namespace="test", job=f"fsdp2-{uuid.uuid4().hex[:8]}")
    store = await weights_only(nc.jetstream(), names)
    try:
        for name, blob in read_all(parts).items():
            await store.put(name, blob)
        follower, fresh = WeightSync(store), WeightSync(store)
        for version in range(STEPS + 1):
            report = await follower.to(version)
            if version:
                assert report.applied == [chain.delta_name(version - 1, version)]
        applied = (await fresh.to(STEPS)).applied
        assert applied == [chain.keyframe_name(3), chain.delta_name(3, 4), chain.delta_name(4, 5)]
        assert follower.state is not None
        assert fresh.state is not None
        return follower.state, fresh.state
    finally:
        await store.close()
        await natsconfig.remove(nc.jetstream(), names, [POLICY])
        await nc.close()


def run(
    world: int,
    strategy: Strategy,
    workdir: Path,
    out: Path,
    *,
    first: int = 0,
    save_after: int = SAVED_AT,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
        train,
        args=(world, str(strategy), workdir, out, first, save_after),
        nprocs=world,
        join=True,
    )
    figures = json.loads(Path(f"{out}.json").read_text())
    return figures, torch.load(f"{out}.pt")


@pytest.mark.timeout(600)
def test_fsdp2_takes_the_data_parallel_steps_holds_half_and_resumes_on_other_rank_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_server: NatsServer
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    models = tmp_path / "models"  # one tiny model, made once, every run's start
    ddp, ddp_weights = run(2, Strategy.DDP, models, tmp_path / "ddp")
    sharded, sharded_weights = run(2, Strategy.FSDP2, tmp_path / "fsdp2", tmp_path / "fsdp2")
    # Same steps: losses and weights within 1e-5.
    assert len(ddp["losses"]) == STEPS
    assert sharded["losses"] == pytest.approx(ddp["losses"], abs=1e-5, rel=1e-5)
    assert sharded_weights.keys() == ddp_weights.keys()
    for name, tensor in ddp_weights.items():
        torch.testing.assert_close(sharded_weights[name], tensor, rtol=1e-5, atol=1e-5)
    assert len(set(ddp["losses"])) > 1  # the steps did something
    assert sharded["completions"] == ddp["completions"]  # decoded on shards, in step
    # Published from the shards: a replica's weights are the data-parallel publication of
    # the same weights (`Learner.bf16`), bit for bit, by deltas or from a keyframe.
    published = {name: tensor.to(torch.bfloat16) for name, tensor in sharded_weights.items()}
    for state in asyncio.run(replicas_of(nats_server.url, tmp_path / "fsdp2.parts")):
        assert state.keys() == published.keys()
        for name, tensor in published.items():
            assert torch.equal(state[name].view(torch.int16), tensor.view(torch.int16)), name
    loss_gap = max(abs(a - b) for a, b in zip(sharded["losses"], ddp["losses"], strict=True))
    weight_gap = max((sharded_weights[n] - t).abs().max().item() for n, t in ddp_weights.items())
    print(f"fsdp2 vs ddp after {STEPS} steps: losses {loss_gap:.2e}, weights {weight_gap:.2e}")
    print(f"bytes per rank: ddp {ddp['bytes']}, fsdp2 {sharded['bytes']}")
    # Each rank holds about half: within 10 % plus the largest layer.
    for kind in ("parameter_bytes", "gradient_bytes", "optimizer_bytes"):
        half = ddp["bytes"][kind] / 2
        slack = 0.1 * half + ddp["bytes"]["largest_layer"]
        assert abs(sharded["bytes"][kind] - half) <= slack, (kind, sharded["bytes"], ddp["bytes"])
        assert sharded["bytes"][kind] < 0.75 * ddp["bytes"][kind], kind
    # 2 -> 1: the checkpoint saved after step 3 resumes on one rank, and its steps' losses
    # are the uninterrupted run's; 1 -> 2: the one rank's checkpoint after step 4 resumes on
    # two, and so is its last step's.
    resumed = tmp_path / "fsdp2" / "saved"
    assert sharded_checkpoint.holds_shards(resumed / "checkpoint")  # DCP, one file per rank
    assert len(list((resumed / "checkpoint" / "sharded").glob("*.distcp"))) == 2
    torn = resumed / ".checkpoint.staging"  # a save killed before its rename: never resumed
    (torn / "sharded").mkdir(parents=True)
    (torn / checkpoint.STATE).write_text('{"step": 99, "version": 99, "epoch": 0}')
    one, _ = run(1, Strategy.FSDP2, resumed, tmp_path / "one", first=SAVED_AT, save_after=4)
    assert one["losses"] == pytest.approx(sharded["losses"][SAVED_AT:], abs=1e-5, rel=1e-5)
    again = resumed / "saved"
    two, two_weights = run(2, Strategy.FSDP2, again, tmp_path / "two", first=4, save_after=5)
    assert two["losses"] == pytest.approx(sharded["losses"][4:], abs=1e-5, rel=1e-5)
    for name, tensor in sharded_weights.items():
        torch.testing.assert_close(two_weights[name], tensor, rtol=1e-5, atol=1e-5)
    # polyrl export assembles the whole model from the shards, in one process.
    out = export.export_checkpoint(again / "saved" / "checkpoint", tmp_path / "hf", dtype="float32")
    exported = load_file(str(out / "model.safetensors"))
    for name, tensor in two_weights.items():
        if name in exported:  # a tied head is stored once
            assert torch.equal(exported[name], tensor), name
