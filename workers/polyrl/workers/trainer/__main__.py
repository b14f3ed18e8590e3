"""`python -m polyrl.workers.trainer`: what torchrun runs on every rank of a trainer.

gloo on CPU and nccl on GPU, data-parallel across ranks. Every rank checks its input and
builds a tiny model before the rendezvous (so every rank fails at once, and transformers
writes files on every rank); rank 0 connects to NATS and runs the loop (`loop`), the others
follow it (`ranks.follow`) and serve their pod's readiness probe.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sys

import torch
import torch.distributed as dist

from polyrl.api.launch import WorkerConfig
from polyrl.workers import preflight
from polyrl.workers.errors import ConfigError, Unavailable
from polyrl.workers.models import loading as models
from polyrl.workers.runtime import prometheus as worker_metrics
from polyrl.workers.runtime.worker import Runtime, fail, load_config, torch_threads, workdir_for
from polyrl.workers.trainer import before_rl, ranks
from polyrl.workers.trainer.learner import Learner
from polyrl.workers.trainer.loop import run

log = logging.getLogger("polyrl.trainer")


async def serve(config: WorkerConfig, pod: str) -> None:
    policy = config.spec.policy(config.policy or "")
    if policy is None:
        raise ConfigError(f"policy {config.policy!r} is not in the job's spec")
    role = preflight.roles(config.spec)[policy.name]
    torch.set_num_threads(torch_threads())
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer = Learner(
        policy, config.spec.algorithm, workdir=workdir_for(config), rank=rank, world=world
    )
    if world > 1:
        log.info("rank %d of %d (%s)", rank, world, dist.get_backend())
    if rank != 0:
        _stop_when_rank_0_says(rank)
        trainer.sync_from_leader()
        _serve_follower_readiness(config)
        prepare = functools.partial(before_rl.follow, trainer, role, config.spec)
        await asyncio.to_thread(ranks.follow, trainer, prepare)
        log.info(await asyncio.to_thread(ranks.agree, trainer.state.step, trainer.model))
        return
    rt = await Runtime.connect(config, pod)
    rt.install_signal_handlers()
    # A resumed trainer says where it resumed from at once, not step 0 until its first step.
    state = trainer.state
    rt.figures = {"step": state.step, "weight_version": max(0, state.version)}
    beat = asyncio.create_task(rt.heartbeat_forever())
    try:
        await run(rt, trainer, role)
    finally:
        beat.cancel()
        await rt.close()
        log.info("disconnected")


def _stop_when_rank_0_says(rank: int) -> None:
    """A rank other than 0 ends when rank 0 orders it (`ranks.Order.STOP`), not on SIGTERM
    or SIGINT: a deleted pod, the end of a job or `polyrl run` stopping signals every rank
    at once, and rank 0 then saves its last checkpoint, which under fsdp2 needs every rank.
    torchrun kills a rank that outlives its grace period."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(
            sig, log.info, "rank %d: %s; stopping when rank 0 says so", rank, sig.name
        )


def _serve_follower_readiness(config: WorkerConfig) -> None:
    """A gang's other pods (their local rank 0) are Ready once they follow rank 0, which
    alone heartbeats: their port answers the readiness probe (and serves no figures)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        worker_metrics.from_env(str(config.role), config.policy or "", ready=lambda: None)


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config, pod = load_config()
        policy = config.spec.policy(config.policy or "")
        if policy is None:
            raise ConfigError(f"policy {config.policy!r} is not in the job's spec")
        preflight.policy_model(policy)  # before the rendezvous: every rank fails at once
        preflight.roles(config.spec)
    except ConfigError as err:
        return fail("polyrl trainer", err)
    models.prepare(policy.model, cache_dir=workdir_for(config) / "models")
    ranks.init_process_group()
    try:
        asyncio.run(serve(config, pod))
    except (ConfigError, Unavailable) as err:
        return fail("polyrl trainer", err)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
