"""A benchmark part: a trainer whose step takes modelled time instead of doing the math.

`polyrl bench pipeline --simulated` and `polyrl bench scale` need a trainer as fast or as slow
as one on hardware this machine does not have. This one does everything the trainer's loop
(`loop`) does on NATS, in the same order, with the same parts: it publishes the model bundle
the workflow runner reads its tokenizer from, takes batches with the real intake
(`intake.pull_batch`: parse, staleness filter, dead letters), and after each step announces
the new version, says it in a heartbeat and only then acknowledges the batch. The step itself
is `runtime.simulation.TrainCost` applied to the batch's tokens, divided by `compression`.
What it leaves out: the learner, the delta encoding (its announcements name no object:
`rollout.announced` follows versions alone), checkpoints and evaluation. Nothing here
imports torch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from pathlib import Path
from typing import Any

from polyrl.api.messages import WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.resources import Mode
from polyrl.workers.runtime.simulation import TrainCost
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.trainer.intake import pull_batch
from polyrl.workers.weightsync import announce, bundle


class SimulatedTrainer:
    """One policy's trainer, steps modelled; `records` holds one dict per step."""

    def __init__(
        self,
        rt: Runtime,
        *,
        cost: TrainCost,
        compression: float = 1.0,
        steps: int | None = None,
        bundle_dir: Path | None = None,
    ) -> None:
        assert rt.config.policy is not None, "a trainer trains one policy"
        self.rt, self.policy = rt, rt.config.policy
        self.cost, self.compression, self.steps = cost, compression, steps
        self.bundle_dir = bundle_dir
        spec = rt.config.spec
        self.batch = spec.policy(self.policy).trainer.batch_size  # type: ignore[union-attr]
        self.sync = spec.algorithm.mode == Mode.SYNC
        self.max_staleness = 0 if self.sync else spec.algorithm.max_staleness
        self.version = self.step = 0
        self.records: list[dict[str, Any]] = []
        self.trained_ids: collections.Counter[str] = collections.Counter()
        self.dropped = 0

    async def run(self) -> None:
        names = self.rt.names
        if self.bundle_dir is not None:
            await bundle.publish(self.rt.js, names, self.policy, self.bundle_dir)
        sub = await self.rt.js.pull_subscribe(
            names.trajectories_subject(self.policy),
            durable=JobNames.trainer_consumer,
            stream=names.trajectories_stream(self.policy),
        )
        await self._announce(final=False)
        self.rt.figures |= {"step": 0, "weight_version": 0}
        await self.rt.enter(WorkerState.TRAINING)
        try:
            while not self.rt.stopping.is_set() and (self.steps is None or self.step < self.steps):
                if not await self._step(sub):
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _step(self, sub: Any) -> bool:
        waiting = time.monotonic()
        kept, msgs, dropped = await pull_batch(
            self.rt, sub, self.batch, version=self.version, max_staleness=self.max_staleness
        )
        if self.rt.stopping.is_set() or not kept:
            return False
        started = time.monotonic()
        tokens = sum(len(t.prompt_tokens) + len(t.tokens) for t in kept)
        modelled = self.cost.seconds(tokens)
        await asyncio.sleep(modelled / self.compression)
        self.step += 1
        self.version += 1
        await self._announce(final=self.steps is not None and self.step >= self.steps)
        self.rt.figures |= {"step": self.step, "weight_version": self.version}
        await self.rt.beat()
        for msg in msgs:
            await msg.ack()
        self.trained_ids.update(t.id for t in kept)
        self.dropped += len(dropped)
        ages = [self.version - 1 - t.weight_version for t in kept]
        self.records.append({
            "step": self.step, "time": time.monotonic(), "samples": len(kept),
            "tokens": tokens, "modelled_seconds": modelled, "wait_seconds": started - waiting,
            "staleness": sum(ages) / len(ages), "dropped": len(dropped),
        })  # fmt: skip
        return True

    async def _announce(self, *, final: bool) -> None:
        announcement = announce.WeightAnnouncement(
            policy=self.policy, version=self.version, epoch=0,
            kind=announce.ObjectKind.KEYFRAME, object=f"simulated-{self.version}",
            size=0, checksum="SHA-256=", final=final,
        )  # fmt: skip
        await announce.publish(self.rt.js, self.rt.names, announcement)
