"""The trainer's loop on rank 0: pull a batch, step, publish the new version, ack, repeat.

Samples are acked only after their step's version is published, so a crash means
redelivery, not loss; the version goes out while the next batch is pulled and trained (one
encoding in flight). When the last step is done the trainer publishes its final version,
saves its checkpoint and says so in one more heartbeat (`done`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from polyrl.api.messages import WorkerState
from polyrl.api.resources import Mode
from polyrl.workers.runtime.worker import Runtime, workdir_for
from polyrl.workers.trainer import ranks
from polyrl.workers.trainer.intake import pull_batch
from polyrl.workers.trainer.leader import Leader
from polyrl.workers.trainer.learner import Learner, shuffled_rewards, to_samples
from polyrl.workers.trainer.ledger import Ledger
from polyrl.workers.workflows import interface as roles

log = logging.getLogger("polyrl.trainer")


async def run(rt: Runtime, trainer: Learner, role: roles.PolicyRole) -> None:
    leader = Leader(rt, trainer, role)
    try:
        await _train(rt, trainer, leader)
    finally:
        leader.encoder.close()
        log.info("delta encoder closed")


async def _train(rt: Runtime, trainer: Learner, leader: Leader) -> None:
    sub = await leader.start()
    await rt.enter(WorkerState.TRAINING)
    spec, state = rt.config.spec, trainer.state
    if state.step == 0 and state.epoch == 0:
        # A checkpoint where RL starts: a trainer lost before its first periodic one resumes
        # in a new epoch after its warm-up instead of doing all of it again in epoch 0.
        await asyncio.to_thread(save, trainer)
    sync = spec.algorithm.mode == Mode.SYNC
    # Sync mode trains only on the current version's samples, with nothing overlapped.
    max_staleness = 0 if sync else spec.algorithm.max_staleness
    last_step = spec.steps_of(trainer.policy)  # None: until stopped (stop.durationSeconds)
    ledger = Ledger(workdir_for(rt.config) if trainer.policy.trainer.ledger else None)
    while not rt.stopping.is_set() and (last_step is None or state.step < last_step):
        waiting = time.monotonic()
        trajectories, msgs, dropped = await pull_batch(
            rt,
            sub,
            trainer.policy.trainer.batch_size,
            version=state.version,
            max_staleness=max_staleness,
        )
        if rt.stopping.is_set() or not trajectories:
            break
        started = time.monotonic()
        samples = to_samples(trajectories)
        if spec.algorithm.shuffle_rewards:
            samples = shuffled_rewards(samples, seed=state.step)
        if trainer.world > 1:
            await asyncio.to_thread(ranks.order, ranks.Order.STEP, samples)
        stats = await asyncio.to_thread(trainer.step, samples)
        stats["train_seconds"] = time.monotonic() - started
        if leader.pool is None:  # on the trainer: before the weights leave
            stats |= await asyncio.to_thread(leader.evaluate)
        # The new version first, then the acks: the workflow runner reads both (its staleness
        # bound, `staleness`), and room in the queue must not show before the version it is for.
        await leader.publish_next(final=last_step is not None and state.step >= last_step)
        trained = [t.id for t in trajectories]
        ledger.record(epoch=state.epoch, step=state.step, trained=trained, stale=dropped)
        for msg in msgs:
            await msg.ack()
        if sync and leader.publishing is not None:
            await leader.publishing
        stats |= await leader.evaluate_landed()  # on the pool: once they have landed
        stats["wait_seconds"] = started - waiting
        leader.record(stats, dropped=len(dropped), seconds=time.monotonic() - started)
        if state.step % trainer.policy.trainer.checkpoint_every == 0:
            save(trainer)
    await _finish(rt, trainer, leader, sub, last_step)


async def _finish(
    rt: Runtime, trainer: Learner, leader: Leader, sub: Any, last_step: int | None
) -> None:
    """After the last step, or on SIGTERM: let the version being published land, save, stop
    the other ranks (a sharded model's save needs them), and say so."""
    state = trainer.state
    log.info("training stopped at step %d", state.step)
    if leader.publishing is not None:
        await leader.publishing
    save(trainer)
    if trainer.world > 1:
        await asyncio.to_thread(ranks.order, ranks.Order.STOP)
    await asyncio.to_thread(trainer.saved)  # every rank: the last checkpoint in place
    if trainer.world > 1:
        log.info(await asyncio.to_thread(ranks.agree, state.step, trainer.model))
    log.info("version %d published and checkpoint saved", state.version)
    if last_step is not None and state.step >= last_step:
        # Said once more after the last step: the operator reads the final step and version
        # from this heartbeat (the periodic ones went out before the last step).
        rt.state = WorkerState.DONE
        rt.figures |= {"step": state.step, "weight_version": state.version}
        await rt.beat(required=True)
    # A fetch that timed out can still receive its late deliveries, which then sit unread in the
    # subscription's queue and hold the connection's drain until its timeout (30 s by default,
    # seen at the end of every quick start). Unacked, they are redelivered to a later trainer.
    # After the checkpoint: a connection lost by now must not cost the last save.
    with contextlib.suppress(Exception):
        await sub.unsubscribe()


def save(trainer: Learner) -> None:
    """A checkpoint; a sharded model's ranks all write theirs, told to by rank 0."""
    if trainer.sharded:
        ranks.order(ranks.Order.SAVE)
    trainer.save()
