"""Rank 0's NATS side of the trainer: the bundle, weight publication, trajectories, figures.

Only rank 0 talks to NATS: it publishes the model bundle and
version 0, pulls `batchSize` fresh trajectories per step through a durable consumer
(samples more than `maxStaleness` versions old are acked, dropped and counted), shares
them with the other ranks, and acks them only after the step, so a crash means
redelivery, not loss. Each rank trains on its share; gradients are averaged. After the
step rank 0 publishes the new weights (a sparse delta, or a keyframe every
`keyframeEvery` versions; every version is a keyframe under `weightSync: full`) while the
next batch is pulled and trained: only the encoding of one version is in flight.

Before RL, rank 0 runs what the policy's role in the workflow asks (`workflows.interface`): a supervised
warm start on its examples (`warmstart`), its evaluation's preparation (the solver-verifier's
exam), and the held-out figures RL starts from. The model and the GRPO step itself are
`learner.Learner`; the loop that drives both is `loop`, and `__main__` the process's entry.
Checkpoints (`checkpoint`) every `checkpointEvery` steps and on exit; a restarted trainer
resumes in a new epoch and numbers versions after the last one announced.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from nats.js.errors import APIError

from polyrl.api import natsconfig
from polyrl.api.naming import JobNames
from polyrl.api.resources import EvalOn, Strategy
from polyrl.workers.deltas.encoders.process import ProcessEncoder
from polyrl.workers.errors import StorageFull
from polyrl.workers.runtime import outage
from polyrl.workers.runtime.worker import MetricsLog, Runtime
from polyrl.workers.trainer import before_rl, ranks, shard_publish, warmstart
from polyrl.workers.trainer.learner import Learner
from polyrl.workers.trainer.pool_scoring import EvaluationStopped, PoolScorer
from polyrl.workers.weightsync import announce, bundle, retention
from polyrl.workers.weightsync.announce import Payload
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.store import WeightStore
from polyrl.workers.workflows import interface as roles

log = logging.getLogger("polyrl.trainer")
CONSUMER = JobNames.trainer_consumer
T = TypeVar("T")


class NatsHandoff:
    """`workflows.interface.Handoff` over the job's NATS: objects beside each policy's weights."""

    def __init__(self, rt: Runtime, policy: str) -> None:
        self.rt, self.policy = rt, policy

    async def publish(self, name: str, data: bytes) -> None:
        store = await self.rt.js.object_store(self.rt.names.weights_bucket(self.policy))
        await store.put(name, data)

    async def fetch(self, policy: str, name: str, *, timeout: float) -> bytes | None:
        return await bundle.wait_for_object(
            self.rt.js, self.rt.names, policy, name, timeout=timeout, poll=0.5
        )


class PublishedKind(enum.StrEnum):
    """What a published weight object is, as metrics name it."""

    KEYFRAME = "keyframe"  # the whole model
    DELTA = "delta"  # the model's changes since the last version
    ADAPTER = "adapter"  # a whole LoRA adapter (its keyframe)
    ADAPTER_DELTA = "adapter-delta"  # an adapter's changes since the last version
    BASE = "base"  # the frozen base adapters are served on, once per trainer life


def published_kind(announcement: announce.WeightAnnouncement) -> PublishedKind:
    keyframe = announcement.kind == announce.ObjectKind.KEYFRAME
    if announcement.payload == Payload.ADAPTER:
        return PublishedKind.ADAPTER if keyframe else PublishedKind.ADAPTER_DELTA
    return PublishedKind.KEYFRAME if keyframe else PublishedKind.DELTA


class Leader:
    """Rank 0's NATS side: bundle, weight publication, trajectories, heartbeats, metrics."""

    def __init__(self, rt: Runtime, trainer: Learner, role: roles.PolicyRole) -> None:
        self.rt, self.trainer, self.role = rt, trainer, role
        self.policy = trainer.policy
        self.publishing: asyncio.Task[Any] | None = None
        # Started now, so that its imports overlap the warm-up; encoding in a process of its own
        # keeps it from slowing the training steps it runs beside (`encoders`).
        self.encoder = ProcessEncoder()
        self.started = time.monotonic()  # reset once training starts (after the warm-up)
        self.waited = 0.0
        self.stale_dropped = 0  # samples dropped as too old, since this trainer started
        self.bucket_limit = 0  # messages the weights bucket may hold (`bound_bucket`)
        self.metrics = MetricsLog.from_env()
        spec = rt.config.spec
        self.scorer = before_rl.model_scorer(trainer, role, spec)
        self.pool: PoolScorer | None = None  # `trainer.evalOn: rollout` (made in `start`)
        self.step0: dict[str, float] = {}  # warm-up figures the step-0 record carries
        self.publish_seconds: float | None = None  # the last version's encoding and upload
        self.last_published: dict[str, Any] = {}  # the last version's bytes and kind

    async def start(self) -> Any:
        # Config and tokenizer first: the workflow runner encodes this policy's prompts with
        # them, and neither changes in the warm-up.
        await bundle.publish_exported(
            self.rt.js, self.rt.names, self.policy.name, self.trainer.export
        )
        await self.warm_up_and_evaluate()
        store = await WeightStore.open(self.rt.js, self.rt.names.weights_bucket(self.policy.name))
        every = shard_publish.keyframe_every(self.policy)
        last = await announce.latest(self.rt.js, self.rt.names, self.policy.name)
        if last is not None and last.epoch >= self.trainer.state.epoch:
            # Resumed from a checkpoint an earlier life already resumed from: its epoch
            # would repeat. Each life of the trainer announces under an epoch of its own.
            self.trainer.state.epoch = last.epoch + 1
        self.publisher = WeightPublisher(
            store,
            self.rt.names,
            self.policy.name,
            keyframe_every=every,
            epoch=self.trainer.state.epoch,
            encoder=self.encoder,
            payload=Payload.ADAPTER if self.trainer.sends_adapters else Payload.MODEL,
        )
        await self.bound_bucket(store, every)
        first = max(self.trainer.state.version, last.version if last else -1) + 1
        if self.trainer.sends_adapters:
            size = await self.publisher.publish_base(self.trainer.base_bf16())
            self.observe_published([(PublishedKind.BASE, size)])
        if self.trainer.sharded:
            await self.publish_parts(first, final=False)
        else:
            state = self.trainer.published()
            self.note_published(first, await self.publisher.publish(state, first))
        self.trainer.state.version = first
        if self.pool is not None:  # the pool serves the start only now
            self.stage("evaluating on the rollout pool")
            self.write_start(await self.evaluate_landed())
        self.started = time.monotonic()
        self.stage("training")
        return await self.rt.js.pull_subscribe(
            self.rt.names.trajectories_subject(self.policy.name),
            durable=CONSUMER,
            stream=self.rt.names.trajectories_stream(self.policy.name),
        )

    async def warm_up_and_evaluate(self) -> None:
        """The warm start (held-out figures before it, when both run), what the policy's
        role runs before RL, and the held-out figures RL starts from, as step 0. Sharded
        (`before_rl`), the ranks shard the model first and run the warm-up and the
        preparation together, without the figures before the warm-up."""
        state, spec = self.trainer.state, self.rt.config.spec
        resumed = before_rl.resumed(self.trainer)
        warming = warmstart.will_run(self.policy, self.role.warmup, resumed=resumed)
        together = self.policy.trainer.strategy == Strategy.FSDP2
        if together:
            await asyncio.to_thread(self.trainer.sync_from_leader)  # shards the model
            if self.trainer.world > 1:
                await asyncio.to_thread(ranks.order, ranks.Order.PREPARE)
        self.stage("evaluating")
        # Before the warm-up on the trainer: no pool ever serves those weights.
        alone = warming and not together
        before = await asyncio.to_thread(self.evaluate, self.scorer) if alone else {}
        self.stage("warming up" if warming else "starting")
        warmed = await asyncio.to_thread(
            warmstart.warm_start,
            self.trainer.model,
            self.scorer.tokenizer,
            self.policy,
            self.role.warmup,
            seed=spec.workflow.task.seed,
            max_new_tokens=self.scorer.max_new_tokens,
            resumed=resumed,
        )
        if warmed:
            log.info("supervised warm-up: %s", warmed)
            if together:  # the anchor was frozen before it (`before_rl`)
                self.trainer.anchor_here()
        if self.role.evaluator is not None:  # it may decode on the trainer
            self.stage("preparing its evaluation")
            handoff = NatsHandoff(self.rt, self.policy.name)
            await self.role.evaluator.prepare(handoff, self.scorer, first=state.step == 0)
        if not together:
            await asyncio.to_thread(self.trainer.sync_from_leader)
        self.step0 = warmstart.prefixed(warmed) | warmstart.prefixed(before, "before_warmup_")
        if self.policy.trainer.eval_on == EvalOn.ROLLOUT:
            # Through the pool once it serves the start (`start`, after the first version).
            self.pool = PoolScorer(
                rt=self.rt,
                policy=self.policy.name,
                tokenizer=self.scorer.tokenizer,
                max_new_tokens=self.scorer.max_new_tokens,
                answer_tokens=self.scorer.answer_tokens,
                samples=self.policy.trainer.eval_samples,
                temperature=spec.algorithm.temperature,
                loop=asyncio.get_running_loop(),
            )
            return
        self.stage("evaluating")
        self.write_start(await asyncio.to_thread(self.evaluate))

    def write_start(self, figures: dict[str, float]) -> None:
        """Where RL starts from, as step 0 (not again when resumed)."""
        if figures and self.trainer.state.step == 0:
            version = self.trainer.state.version
            self.write_metrics({"step": 0, "version": version, **figures, **self.step0})

    async def evaluate_landed(self) -> dict[str, float]:
        """With `evalOn: rollout`: held-out figures of the version just published, once it
        has landed (the pool serves it; the trainer waits, so the pool stays on it)."""
        if self.pool is None or not self.due():
            return {}
        if self.publishing is not None:
            await self.publishing
        self.pool.version = self.trainer.state.version
        try:
            return await asyncio.to_thread(self.evaluate)
        except EvaluationStopped as stopped:
            log.info("%s", stopped)
            return {}

    def due(self) -> bool:
        """Is this step one the policy is evaluated at (every `evalEvery`, and step 0)?"""
        every = self.policy.trainer.eval_every
        return self.role.evaluator is not None and every > 0 and not self.trainer.state.step % every

    def evaluate(self, scorer: roles.Scorer | None = None) -> dict[str, float]:
        """Held-out figures every `evalEvery` steps (and at step 0), with `held_out`, the
        evaluator's headline, which status and plots lead with; by the policy's scorer
        (its pool's, with `evalOn: rollout`) unless given one."""
        evaluator = self.role.evaluator
        if evaluator is None or not self.due():
            return {}
        started = time.monotonic()
        figures = evaluator.evaluate(scorer or self.pool or self.scorer)
        figures["eval_seconds"] = round(time.monotonic() - started, 3)
        if self.pool is not None and scorer is None:
            figures["eval_off_version"], self.pool.off_version = self.pool.off_version, 0
        log.info(  # on a cluster, where no metrics.jsonl is written, the log has them
            "held-out at step %d: %s",
            self.trainer.state.step,
            ", ".join(f"{k} {v:.4g}" for k, v in sorted(figures.items())),
        )
        held_out = figures.get(evaluator.headline)
        if held_out is not None:
            figures["held_out"] = held_out
            self.rt.figures["held_out"] = held_out
        return figures

    async def bound_bucket(self, store: WeightStore, keyframe_every: int) -> None:
        """Limit the weights bucket to what retention keeps for a model of this size."""
        model_bytes = self.trainer.weight_bytes()
        self.bucket_limit = natsconfig.weights_bucket_messages(
            model_bytes,
            store.chunk_size,
            keyframe_every,
            retention.KEEP_KEYFRAMES,
            parts=self.trainer.world if self.trainer.sharded else 1,
        )
        await natsconfig.bound_weights(
            self.rt.js, self.rt.names, self.policy.name, self.bucket_limit
        )
        log.info(
            "weights bucket bounded at %d messages (%d MiB of bf16 weights, chunks of %d KiB)",
            self.bucket_limit, model_bytes >> 20, store.chunk_size >> 10,
        )  # fmt: skip

    async def publish_next(self, *, final: bool = False) -> None:
        """Publish the just-trained weights off the critical path (one in flight); `final`:
        the last version, after which this trainer stops."""
        if self.publishing is not None:
            await self.publishing
        version = self.trainer.state.version + 1
        self.trainer.state.version = version
        if self.trainer.sharded:  # every rank encodes its rows now, between two steps
            await self.publish_parts(version, final=final)
            self.publishing = asyncio.create_task(self._prune())
        else:  # the weights leave the model now, before the next step changes them
            state = self.trainer.published()
            self.publishing = asyncio.create_task(self._publish(version, state, final=final))
        # Said at once, not at the next periodic heartbeat: the workflow runner asks for the
        # samples of later batches at this version (`staleness`), which rollouts serve once it lands.
        self.rt.figures["weight_version"] = version
        await self.rt.beat()

    async def publish_parts(self, version: int, *, final: bool) -> None:
        """Sharded: every rank encodes its rows of `version`; rank 0 writes its own part of
        each object, then each other rank's as it arrives, and announces the object once
        (`shard_publish`). On the step's path: the other ranks wait for the writes."""
        started = time.monotonic()
        parts = self.trainer.parts
        assert parts is not None
        ranks.order(ranks.Order.PUBLISH, version)
        mine = await asyncio.to_thread(self.trainer.publish_part, version)
        world, announced = self.trainer.world, []
        for part in mine:
            metas = []
            for rank in range(world):
                blob = part.blob if rank == 0 else await asyncio.to_thread(parts.receive, rank)
                write = functools.partial(self.publisher.put_part, part.name, rank, world, blob)
                metas.append(await self._stored(write, version))
            say = functools.partial(
                self.publisher.announce_parts,
                version, part.name, part.kind, part.base, metas, final=final,
            )  # fmt: skip
            announced.append(await self._stored(say, version))
        self.publish_seconds = round(time.monotonic() - started, 3)
        self.note_published(version, announced)

    async def _publish(self, version: int, state: dict[str, Any], *, final: bool) -> None:
        """Publish `version` (its weights, `state`), then prune the bucket (`_prune`)."""
        started = time.monotonic()
        # A retry rewrites the same objects; the announcements carry message ids.
        write = functools.partial(self.publisher.publish, state, version=version, final=final)
        announced = await self._stored(write, version)
        # Encoding and upload, off the critical path: the next step's record carries it.
        self.publish_seconds = round(time.monotonic() - started, 3)
        self.note_published(version, announced)
        await self._prune()

    async def _stored(self, write: Callable[[], Awaitable[T]], version: int) -> T:
        """`write()` (an object of `version`, or its announcement), retried while NATS is
        away; `StorageFull` when the bucket is at its limit."""
        try:
            return await outage.retry(write, what=f"publishing weight version {version}")
        except APIError as err:
            if not natsconfig.is_full(err):
                raise
            raise StorageFull(
                f"weights bucket {self.rt.names.weights_bucket(self.policy.name)} is full "
                f"({self.bucket_limit} messages, what retention keeps for this model with "
                f"keyframeEvery {self.policy.keyframe_every}): version {version} not published"
            ) from err

    async def _prune(self) -> None:
        """Prune the bucket (`retention`): nothing a live replica or a new one needs goes,
        and the bucket stays bounded however long the job runs."""
        try:
            live = await retention.live_versions(self.rt.kv, self.policy.name)
            await retention.prune(self.publisher, live)
        except Exception as err:  # a prune is retried after the next version; never fatal
            log.warning("pruning the weights bucket failed (retried next version): %s", err)

    def record(self, stats: dict[str, float], *, dropped: int, seconds: float) -> None:
        state = self.trainer.state
        self.waited += stats.get("wait_seconds", 0.0)
        elapsed = time.monotonic() - self.started
        # The pace ETAs are made of (waiting for samples included): smoothed, so one slow
        # step (an evaluation) moves it little.
        pace = self.rt.figures.get("step_seconds")
        wall = seconds + stats.get("wait_seconds", 0.0)
        self.stale_dropped += dropped
        self.rt.figures |= {  # held_out stays as the last evaluation left it
            "step": state.step,
            "weight_version": state.version,
            "reward": stats.get("reward"),
            "idle_fraction": min(1.0, self.waited / elapsed) if elapsed > 0 else None,
            "step_seconds": round(wall if pace is None else 0.8 * pace + 0.2 * wall, 3),
            "staleness_p50": stats.get("staleness_p50"),
            "staleness_p95": stats.get("staleness_p95"),
            "stale_dropped": self.stale_dropped,
            "is_deviation": stats.get("is_deviation"),
            "clip_fraction": stats.get("clip_frac"),
            "is_m2": stats.get("is_m2"),
        }
        if self.rt.exported is not None:
            self.rt.exported.observe_staleness(self.trainer.last_ages)
        self.write_metrics(
            {
                "step": state.step,
                "version": state.version,
                "stale_dropped": dropped,
                "step_seconds": round(seconds, 4),
                **stats,
                **({"publish_seconds": self.publish_seconds} if self.publish_seconds else {}),
                **self.last_published,
            }
        )

    def note_published(self, version: int, announced: list[announce.WeightAnnouncement]) -> None:
        """What `version` cost on the wire, by kind: for the next metrics record, Prometheus
        and the log."""
        kinds = [(published_kind(a), a.size) for a in announced]
        parts = "".join(f" in {a.parts} parts" for a in announced[:1] if a.parts > 1)
        self.last_published = {
            "published_version": version,
            "published_bytes": sum(size for _, size in kinds),
            "published_kind": "+".join(kind for kind, _ in kinds),
        }
        self.observe_published(kinds)
        log.info(
            "version %d published%s: %s",
            version, parts, ", ".join(f"{kind} {size / 1e6:.3g} MB" for kind, size in kinds),
        )  # fmt: skip

    def observe_published(self, kinds: Sequence[tuple[str, int]]) -> None:
        if self.rt.exported is not None:
            for kind, size in kinds:
                self.rt.exported.observe_published(kind, size)

    def write_metrics(self, figures: dict[str, Any]) -> None:
        self.metrics.write([{"policy": self.policy.name, **figures, "time": time.time()}])

    def stage(self, stage: str) -> None:
        """What the trainer does now, for the run's progress display."""
        self.metrics.stage(self.policy.name, stage)
