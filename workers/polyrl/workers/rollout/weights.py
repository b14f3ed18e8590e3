"""A rollout worker's weight source: announcements in, verified weights into the engine.

Wraps `weightsync.sync.WeightSync` for one engine: it reads the policy's latest announcement,
brings the weights there (delta chain or keyframe, whichever is cheaper; a refused object
means a resync from a keyframe), then makes the engine serve them. Where the engine's
weights are live tensors the codec patched the model itself; otherwise the verified host
copy is pushed with `load_weights`. Only verified weights ever reach the engine.

A LoRA policy under adapter sync (`trainer.lora.sync: adapter`, `adapter_alpha` given)
announces adapter versions: the engine is built on the frozen base (`read_base`, before this
class is used), and the worker follows the adapters' own chain of keyframes and deltas
exactly as above, handing each version to the engine's `load_adapter`
(`engines.base.ServesAdapters`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import torch
from nats.js import JetStreamContext

from polyrl.api.naming import JobNames
from polyrl.workers.deltas import decode
from polyrl.workers.deltas.errors import DeltaError
from polyrl.workers.errors import Stopped
from polyrl.workers.models.adapters import Adapter
from polyrl.workers.rollout.engines.base import Engine, ServesAdapters
from polyrl.workers.weightsync import announce
from polyrl.workers.weightsync.store import ObjectMissing, WeightObjectError, WeightStore
from polyrl.workers.weightsync.sync import SyncFailed, SyncReport, WeightSync

log = logging.getLogger("polyrl.weights")


class EngineWeights:
    def __init__(
        self,
        js: JetStreamContext,
        names: JobNames,
        policy: str,
        store: WeightStore,
        *,
        malformed: announce.Malformed | None = None,
        adapter_alpha: int | None = None,
        pool_base: str | None = None,
    ) -> None:
        self.js, self.names, self.policy = js, names, policy
        self.malformed = malformed  # told of each malformed announcement passed over
        self.sync = WeightSync(store)
        self.adapter_alpha = adapter_alpha  # set: the policy sends LoRA adapters
        # Set: the policy is served in another policy's pool (`rollout.servedBy`), on the
        # base whose digest this is; its own trainer's base must be the same.
        self.pool_base = pool_base
        self.attached = False  # sync.state is the engine's own tensors
        self.failures = 0
        self.last: SyncReport | None = None  # the last sync that reached its version

    async def close(self) -> None:
        await self.sync.store.close()

    @property
    def version(self) -> int | None:
        return self.sync.version

    async def update(self, engine: Engine) -> int | None:
        """Serve the newest announced weights; the version if it changed, else None."""
        latest = await announce.latest(self.js, self.names, self.policy, malformed=self.malformed)
        if latest is None or (latest.version, latest.epoch) == (self.sync.version, self.sync.epoch):
            return None
        try:
            self._check_payload(latest)
            await self._check_base()
            report = await self.sync.follow(latest)
        except SyncFailed as err:
            self.failures += 1
            log.warning(
                "weight sync to version %d failed, still serving %s: %s",
                latest.version,
                self.sync.version,
                err,
            )
            return None
        started = time.perf_counter()
        self._push(engine)
        report.seconds += time.perf_counter() - started  # what it cost the engine, too
        self.last = report
        if self.pool_base is None:  # the engine's own policy: its version is the engine's
            engine.version = self.sync.version or 0
        return self.sync.version

    def figures(self) -> dict[str, float | int | None]:
        """The last sync for the heartbeat (seconds, bytes read, share of weights rewritten)
        and what was refused or failed in all."""
        counts: dict[str, float | int | None] = {
            "weights_refused": self.sync.refusals,
            "sync_failures": self.failures,
        }
        if self.last is None:
            return counts
        return counts | {
            "sync_seconds": round(self.last.seconds, 4),
            "sync_bytes": self.last.bytes,
            "changed_fraction": self.last.changed_fraction,
        }

    def _check_payload(self, latest: announce.WeightAnnouncement) -> None:
        """Refuse (`SyncFailed`) a payload other than the policy's: it would put an adapter
        where weights go, or the reverse."""
        adapters = self.adapter_alpha is not None
        if (latest.payload == announce.Payload.ADAPTER) != adapters:
            expected = "adapters" if adapters else "model weights"
            found = "an adapter" if latest.payload == announce.Payload.ADAPTER else "model weights"
            raise SyncFailed(f"{latest.object} holds {found}, the policy sends {expected}")

    async def _check_base(self) -> None:
        """In a shared pool, refuse (`SyncFailed`) a policy whose trainer's base is not the
        one the engine holds: its adapters would be served on the wrong weights."""
        if self.pool_base is None or self.sync.version is not None:
            return
        try:
            digest = (await self.sync.store.meta(announce.BASE_OBJECT)).digest
        except ObjectMissing as err:
            raise SyncFailed(f"{self.policy}'s trainer has written no base yet") from err
        if digest != self.pool_base:
            raise SyncFailed(
                f"{self.policy}'s base model differs from the one its shared pool holds "
                f"({digest} against {self.pool_base}): its adapters are not served"
            )

    def _push(self, engine: Engine) -> None:
        if self.adapter_alpha is not None:
            assert self.sync.state is not None
            assert isinstance(engine, ServesAdapters)
            adapter = Adapter(dict(self.sync.state), self.adapter_alpha)
            engine.load_adapter(adapter, self.policy)
            return
        if self.attached:
            if not engine.weights_are_live:
                assert self.sync.state is not None
                engine.load_weights(self.sync.state)
            return
        assert self.sync.state is not None
        engine.load_weights(self.sync.state)
        if engine.weights_are_live:
            self.sync.state = engine.weights()  # from now on deltas patch the model in place
            self.attached = True


async def read_base(store: WeightStore, stopping: asyncio.Event) -> dict[str, torch.Tensor]:
    """The frozen base a LoRA policy's adapters are served on (`announce.BASE_OBJECT`), once
    its trainer has written it (after its warm-up); raises `Stopped` if asked to stop first.

    A base that cannot be read (corrupt, or of another format) is an error, not a wait: no
    other object holds it, and the trainer writes it again only when it restarts."""
    while True:
        try:
            blob = await store.get(announce.BASE_OBJECT)
        except ObjectMissing:
            if stopping.is_set():
                raise Stopped("stopped before the trainer wrote the base model") from None
            await asyncio.sleep(0.5)
            continue
        try:
            _, state = await asyncio.to_thread(decode.load_keyframe, blob)
        except DeltaError as err:
            raise WeightObjectError(
                f"{announce.BASE_OBJECT} is not a readable base: {err}"
            ) from err
        return state
