"""The trainer: GRPO steps on a policy's trajectories, then new weights for its rollouts.

Launched by torchrun (`-m polyrl.workers.trainer`), gloo on CPU and nccl on GPU,
data-parallel across ranks. Only rank 0 talks to NATS: it publishes the model bundle and
version 0, pulls `batchSize` fresh trajectories per step through a durable consumer
(samples more than `maxStaleness` versions old are acked, dropped and counted), shares
them with the other ranks, and acks them only after the step, so a crash means
redelivery, not loss. Each rank trains on its share; gradients are averaged. After the
step rank 0 publishes the new weights (a sparse delta, or a keyframe every
`keyframeEvery` versions; every version is a keyframe under `weightSync: full`) while the
next batch is pulled and trained: only the encoding of one version is in flight.

Checkpoints (`checkpoint.py`) every `checkpointEvery` steps and on exit; a restarted
trainer resumes in a new epoch and numbers versions after the last one announced.

With `algorithm.klCoef > 0` every rank keeps a frozen copy of the policy RL started from
(after the warm start) and adds the k3 KL to it to the loss; the copy is checkpointed with
the weights, so a resumed trainer is held to the same anchor.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from nats.aio.msg import Msg
from pydantic import ValidationError

from polyrl.api.launch import TRAINER_DIR_ENV, WorkerConfig, trainer_subdir
from polyrl.api.messages import WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.resources import AlgorithmSpec, Mode, PolicySpec, UniformGroups, WeightSync
from polyrl.api.wire import Trajectory
from polyrl.workers import batching, bundle, checkpoint, evaluation, exam, grpo, preflight, ranks
from polyrl.workers import model as models
from polyrl.workers.deltas import announce
from polyrl.workers.deltas.encoders.process import ProcessEncoder
from polyrl.workers.deltas.publish import WeightPublisher
from polyrl.workers.deltas.store import WeightStore
from polyrl.workers.runtime import (
    ConfigError,
    MetricsLog,
    Runtime,
    Unavailable,
    fail,
    load_config,
    torch_threads,
)
from polyrl.workers.tasks import verify
from polyrl.workers.tasks.base import Problem

log = logging.getLogger("polyrl.trainer")
CONSUMER = JobNames.trainer_consumer


@dataclasses.dataclass(frozen=True, slots=True)
class _Fixed:
    """A micro-batch's log-probs that stay fixed over its batch's updates."""

    prox: torch.Tensor  # the trainer's own, before the batch's first update
    reference: torch.Tensor | None  # the KL anchor's, when klCoef > 0


class Trainer:
    """The model, its optimizer and one GRPO step (no I/O: testable on its own)."""

    def __init__(
        self,
        policy: PolicySpec,
        algo: AlgorithmSpec,
        *,
        workdir: Path,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.policy, self.algo, self.rank, self.world = policy, algo, rank, world
        source = policy.model.model_copy(update={"dtype": "float32"})
        self.model, self.tokenizer = models.make_model(source, cache_dir=workdir / "models")
        opt = policy.trainer.optimizer
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=opt.lr, weight_decay=opt.weight_decay
        )
        self.checkpoint_dir = workdir / "checkpoint"
        self.state = checkpoint.resume(self.checkpoint_dir, self.model, self.optimizer)
        self.reference: torch.nn.Module | None = None  # see `freeze_reference`

    def save(self) -> None:
        checkpoint.save(
            self.checkpoint_dir,
            self.model,
            self.optimizer,
            self.state,
            tokenizer=self.tokenizer,
            reference=self.reference,
        )

    def freeze_reference(self) -> None:
        """The KL term's anchor (klCoef > 0): the policy RL starts from, frozen.

        That is the model after the warm start, or the checkpoint's saved anchor on resume
        (not the resumed weights, which RL has already moved). Rank 0's copy is broadcast, so
        every rank is held to the same one.
        """
        if self.algo.kl_coef == 0:
            return
        reference = copy.deepcopy(self.model)
        saved = checkpoint.load_reference(self.checkpoint_dir) if self.rank == 0 else None
        if saved is not None:
            reference.load_state_dict(saved, strict=False)
        if self.world > 1:
            for tensor in reference.state_dict().values():
                dist.broadcast(tensor, src=0)
        torch.nn.Module.eval(reference)  # transformers' `eval` is untyped
        self.reference = reference.requires_grad_(False)

    def bf16(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to(torch.bfloat16) for k, v in self.model.state_dict().items()}

    def step(self, samples: list[batching.Sample]) -> dict[str, float]:
        """`updatesPerBatch` optimizer steps over this rank's share of `samples`.

        With `trainer.uniformGroups` skip or refill only the groups whose rewards differ are
        trained on. Every rank sees every sample, so all agree whether anything is left to train.
        """
        self.model.train()
        scored = batching.assign_advantages(samples)
        skip = self.policy.trainer.uniform_groups != UniformGroups.KEEP
        trained = batching.informative(scored) if skip else scored
        stats: dict[str, float] = {}
        if trained:
            shard = trained[self.rank :: self.world]  # empty on a rank past a small batch
            pad = int(self.tokenizer.pad_token_id or 0)
            batch = batching.collate(shard, pad) if shard else None
            # Token-mean over the whole step's tokens, divided by the world size because the
            # gradient all-reduce averages over ranks.
            step_tokens = max(1.0, sum(len(s.completion_ids) for s in trained) / self.world)
            fixed: list[_Fixed] = []
            for _ in range(self.policy.trainer.updates_per_batch):
                stats = self._update(batch, step_tokens, fixed)
        self.state.step += 1
        stats["reward"] = sum(s.reward for s in samples) / len(samples)
        stats["trained_fraction"] = len(trained) / len(samples)
        ages = [self.state.version - s.weight_version for s in samples]
        stats["staleness"] = sum(ages) / len(ages)
        return stats

    def _update(
        self, batch: batching.Batch | None, step_tokens: float, fixed: list[_Fixed]
    ) -> dict[str, float]:
        """One optimizer step over `batch`; a rank without a share (None) still joins the
        gradient all-reduce, with zero gradients, so that every rank takes the same step."""
        self.optimizer.zero_grad(set_to_none=True)
        stats = {} if batch is None else self._backward(batch, step_tokens, fixed)
        self._average_gradients()
        settings = self.policy.trainer.optimizer
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), settings.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = scheduled_lr(self.state.step, settings.lr, settings.lr_warmup_steps)
        self.optimizer.step()
        return stats

    def _backward(
        self, batch: batching.Batch, step_tokens: float, fixed: list[_Fixed]
    ) -> dict[str, float]:
        """Accumulate the loss gradient of `batch`, micro-batch by micro-batch.

        `fixed` holds what stays constant across a batch's updates, per micro-batch; the first
        update fills it. Its log-probs are the PPO clip's anchor (`prox`), so later updates of
        the same batch stay within the clip of the policy the batch started from.
        """
        stats: dict[str, float] = {}
        micro = self.policy.trainer.micro_batch_size
        for index, start in enumerate(range(0, batch.input_ids.shape[0], micro)):
            part = slice(start, start + micro)
            new = self._logprobs(self.model, batch, part)
            if index == len(fixed):
                fixed.append(_Fixed(new.detach(), self._reference_logprobs(batch, part)))
            loss, stats = grpo.grpo_loss(
                new,
                batch.old_logprobs[part],
                batch.advantages[part],
                batch.loss_mask[part],
                clip_low=self.algo.clip_low,
                clip_high=self.algo.clip_high,
                tis_cap=self.algo.tis_cap,
                prox_logprobs=fixed[index].prox,
                num_tokens=step_tokens,
                kl_coef=self.algo.kl_coef if fixed[index].reference is not None else 0.0,
                ref_logprobs=fixed[index].reference,
            )
            loss.backward()  # type: ignore[no-untyped-call]
        return stats

    def _reference_logprobs(self, batch: batching.Batch, part: slice) -> torch.Tensor | None:
        if self.reference is None:
            return None
        with torch.no_grad():
            return self._logprobs(self.reference, batch, part)

    def _logprobs(self, model: Any, batch: batching.Batch, part: slice) -> torch.Tensor:
        """`model`'s log-probs of the completion tokens of rows `part`, at sampling temperature."""
        logits = model(
            input_ids=batch.input_ids[part], attention_mask=batch.attention_mask[part]
        ).logits
        return batching.token_logprobs(
            logits, batch.input_ids[part], batch.loss_mask[part], self.algo.temperature
        )

    def _average_gradients(self) -> None:
        if self.world == 1:
            return
        for param in self.model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)
            param.grad /= self.world

    def sync_from_leader(self) -> None:
        """Give every rank rank 0's weights, optimizer state and counters.

        Rank 0 alone warms up and resumes from the checkpoint (other ranks may be on other
        nodes, without it); from then on identical starts and averaged gradients keep the
        ranks identical.
        """
        if self.world > 1:
            for tensor in self.model.state_dict().values():
                dist.broadcast(tensor, src=0)
            shared: list[Any] = [self.optimizer.state_dict(), self.state]
            dist.broadcast_object_list(shared, src=0)
            if self.rank != 0:
                self.optimizer.load_state_dict(shared[0])
                self.state = shared[1]
        self.freeze_reference()


EXAM_TIMEOUT_SECONDS = 600.0


def scheduled_lr(step: int, lr: float, warmup_steps: int) -> float:
    """The learning rate of RL step `step` (0-based): a linear ramp to `lr` over `warmup_steps`.

    A function of the step counter alone, which checkpoints carry, so a resumed trainer picks
    the ramp up where it stopped without a scheduler's state.
    """
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (step + 1) / warmup_steps)


def to_samples(trajectories: list[Trajectory]) -> list[batching.Sample]:
    return [
        batching.Sample(
            prompt_ids=t.prompt_tokens,
            completion_ids=t.tokens,
            behaviour_logprobs=t.logprobs,
            reward=t.reward,
            group_id=t.group_id,
            weight_version=t.weight_version,
        )
        for t in trajectories
    ]


async def pull_batch(
    rt: Runtime, sub: Any, want: int, *, version: int, max_staleness: int
) -> tuple[list[Trajectory], list[Msg], int]:
    """`want` fresh trajectories with their messages (ack later), and how many were stale."""
    kept: list[Trajectory] = []
    msgs: list[Msg] = []
    dropped = 0
    while len(kept) < want and not rt.stopping.is_set():
        with contextlib.suppress(TimeoutError):
            for msg in await sub.fetch(want - len(kept), timeout=1.0):
                try:
                    trajectory = Trajectory.model_validate_json(msg.data)
                except ValidationError as err:
                    await rt.dead_letter(msg.subject, msg.data, f"malformed trajectory: {err}")
                    await msg.term()
                    continue
                fresh, stale = grpo.filter_stale(
                    [trajectory], current_version=version, max_staleness=max_staleness
                )
                dropped += stale
                if stale:
                    await msg.ack()
                else:
                    kept.extend(fresh)
                    msgs.append(msg)
    return kept, msgs, dropped


class Leader:
    """Rank 0's NATS side: bundle, weight publication, trajectories, heartbeats, metrics."""

    def __init__(self, rt: Runtime, trainer: Trainer, workdir: Path) -> None:
        self.rt, self.trainer, self.workdir = rt, trainer, workdir
        self.policy = trainer.policy
        self.publishing: asyncio.Task[Any] | None = None
        # Started now, so that its imports overlap the warm-up; encoding in a process of its own
        # keeps it from slowing the training steps it runs beside (`encoders`).
        self.encoder = ProcessEncoder()
        self.started = time.monotonic()  # reset once training starts (after the warm-up)
        self.waited = 0.0
        self.metrics = MetricsLog.from_env()
        self.exam_cases: list[Problem] = []  # a verifier's fixed exam (`evaluation.exam_cases`)

    async def start(self) -> Any:
        warmed = await asyncio.to_thread(evaluation.warm_start, self.trainer, self.rt.config.spec)
        if warmed:
            log.info("supervised warm-up: %s", warmed)
        await asyncio.to_thread(self.trainer.sync_from_leader)
        await self.share_exam()
        start = await asyncio.to_thread(self.evaluate)
        if start and self.trainer.state.step == 0:  # where RL starts from, as step 0
            self.write_metrics({"step": 0, "version": 0, **start, **evaluation.prefixed(warmed)})
        export = Path(tempfile.mkdtemp(prefix="polyrl-bundle-"))
        try:
            models.export(self.trainer.model, self.trainer.tokenizer, export)
            await bundle.publish(self.rt.js, self.rt.names, self.policy.name, export)
        finally:
            shutil.rmtree(export, ignore_errors=True)
        store = await WeightStore.open(self.rt.js, self.rt.names.weights_bucket(self.policy.name))
        every = 1 if self.policy.weight_sync == WeightSync.FULL else self.policy.keyframe_every
        self.publisher = WeightPublisher(
            store,
            self.rt.names,
            self.policy.name,
            keyframe_every=every,
            epoch=self.trainer.state.epoch,
            encoder=self.encoder,
        )
        last = await announce.latest(self.rt.js, self.rt.names, self.policy.name)
        first = max(self.trainer.state.version, last.version if last else -1) + 1
        await self.publisher.publish(self.trainer.bf16(), version=first)
        self.trainer.state.version = first
        self.started = time.monotonic()
        return await self.rt.js.pull_subscribe(
            self.rt.names.trajectories_subject(self.policy.name),
            durable=CONSUMER,
            stream=self.rt.names.trajectories_stream(self.policy.name),
        )

    async def share_exam(self) -> None:
        """A solver at step 0 publishes its answers for the verifier's exam; the verifier
        waits for them (`exam`)."""
        spec = self.rt.config.spec
        if not evaluation.has_exam(spec):
            return
        solver = spec.policies[0].name
        if self.policy.name == solver and self.trainer.state.step == 0:
            answers = await asyncio.to_thread(
                evaluation.solver_answers, self.trainer.model, self.trainer.tokenizer, spec
            )
            await exam.publish(self.rt.js, self.rt.names, solver, answers)
        elif evaluation.is_verifier(self.policy.name, spec):
            got = await exam.fetch(self.rt.js, self.rt.names, solver, timeout=EXAM_TIMEOUT_SECONDS)
            self.exam_cases = evaluation.exam_cases(got, spec) if got else []
            right = sum(map(verify.truth, self.exam_cases))
            log.info(
                "exam: %d of the %s's answers to judge, %d right",
                len(self.exam_cases),
                solver,
                right,
            )

    def evaluate(self) -> dict[str, float]:
        return evaluation.evaluate(self.trainer, self.rt.config.spec, exam=self.exam_cases)

    async def publish_next(self, *, final: bool = False) -> None:
        """Publish the just-trained weights off the critical path (one in flight); `final`:
        the last version, after which this trainer stops."""
        if self.publishing is not None:
            await self.publishing
        version = self.trainer.state.version + 1
        self.trainer.state.version = version
        self.publishing = asyncio.create_task(
            self.publisher.publish(self.trainer.bf16(), version=version, final=final)
        )
        # Said at once, not at the next periodic heartbeat: the workflow runner asks for the
        # samples of later batches at this version (`ahead`), which rollouts serve once it lands.
        self.rt.figures["weight_version"] = version
        await self.rt.beat()

    def record(self, stats: dict[str, float], *, dropped: int, seconds: float) -> None:
        state = self.trainer.state
        self.waited += stats.get("wait_seconds", 0.0)
        elapsed = time.monotonic() - self.started
        self.rt.figures = {
            "step": state.step,
            "weight_version": state.version,
            "reward": stats.get("reward"),
            "idle_fraction": min(1.0, self.waited / elapsed) if elapsed > 0 else None,
        }
        self.write_metrics(
            {
                "step": state.step,
                "version": state.version,
                "stale_dropped": dropped,
                "step_seconds": round(seconds, 4),
                **stats,
            }
        )

    def write_metrics(self, figures: dict[str, Any]) -> None:
        self.metrics.write([{"policy": self.policy.name, **figures, "time": time.time()}])


async def run(rt: Runtime, trainer: Trainer, workdir: Path) -> None:
    leader = Leader(rt, trainer, workdir)
    try:
        await _train(rt, trainer, leader)
    finally:
        leader.encoder.close()
        log.info("delta encoder closed")


async def _train(rt: Runtime, trainer: Trainer, leader: Leader) -> None:
    sub = await leader.start()
    rt.state = WorkerState.TRAINING
    spec, state = rt.config.spec, trainer.state
    sync = spec.algorithm.mode == Mode.SYNC
    # Sync mode trains only on the current version's samples, with nothing overlapped.
    max_staleness = 0 if sync else spec.algorithm.max_staleness
    last_step = spec.steps_of(trainer.policy)  # None: until stopped (stop.durationSeconds)
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
            await asyncio.to_thread(ranks.share_batch, samples)
        stats = await asyncio.to_thread(trainer.step, samples)
        stats |= await asyncio.to_thread(leader.evaluate)
        # The new version first, then the acks: the workflow runner reads both (its staleness
        # bound, `ahead`), and room in the queue must not show before the version it is for.
        await leader.publish_next(final=last_step is not None and state.step >= last_step)
        for msg in msgs:
            await msg.ack()
        if sync and leader.publishing is not None:
            await leader.publishing
        stats["wait_seconds"] = started - waiting
        leader.record(stats, dropped=dropped, seconds=time.monotonic() - started)
        if state.step % trainer.policy.trainer.checkpoint_every == 0:
            trainer.save()
    log.info("training stopped at step %d", state.step)
    if trainer.world > 1:
        await asyncio.to_thread(ranks.share_batch, None)  # tells the other ranks to stop
    if leader.publishing is not None:
        await leader.publishing
    trainer.save()
    log.info("version %d published and checkpoint saved", state.version)
    if last_step is not None and state.step >= last_step:
        # Said once more after the last step: the operator reads the final step and version
        # from this heartbeat (the periodic ones went out before the last step).
        rt.state = WorkerState.DONE
        rt.figures |= {"step": state.step, "weight_version": state.version}
        await rt.beat()
    # A fetch that timed out can still receive its late deliveries, which then sit unread in the
    # subscription's queue and hold the connection's drain until its timeout (30 s by default,
    # seen at the end of every quick start). Unacked, they are redelivered to a later trainer.
    # After the checkpoint: a connection lost by now must not cost the last save.
    with contextlib.suppress(Exception):
        await sub.unsubscribe()


def shuffled_rewards(samples: list[batching.Sample], *, seed: int) -> list[batching.Sample]:
    """The control experiment's batch: the same samples with their rewards permuted."""
    rewards = [s.reward for s in samples]
    random.Random(seed).shuffle(rewards)
    return [dataclasses.replace(s, reward=r) for s, r in zip(samples, rewards, strict=True)]


def workdir_for(config: WorkerConfig) -> Path:
    root = Path(os.environ.get(TRAINER_DIR_ENV, Path(tempfile.gettempdir()) / "polyrl"))
    return root / trainer_subdir(config.namespace, config.job, config.policy or "policy")


async def serve(config: WorkerConfig, pod: str) -> None:
    policy = config.spec.policy(config.policy or "")
    if policy is None:
        raise ConfigError(f"policy {config.policy!r} is not in the job's spec")
    torch.set_num_threads(torch_threads())
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer = Trainer(
        policy, config.spec.algorithm, workdir=workdir_for(config), rank=rank, world=world
    )
    if rank != 0:
        trainer.sync_from_leader()
        await asyncio.to_thread(ranks.follow, trainer)
        return
    rt = await Runtime.connect(config, pod)
    rt.install_signal_handlers()
    # A resumed trainer says where it resumed from at once, not step 0 until its first step.
    state = trainer.state
    rt.figures = {"step": state.step, "weight_version": max(0, state.version)}
    beat = asyncio.create_task(rt.heartbeat_forever())
    try:
        await run(rt, trainer, workdir_for(config))
    finally:
        beat.cancel()
        await rt.close()
        log.info("disconnected")


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
    except ConfigError as err:
        return fail("polyrl trainer", err)
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
