"""The trainer's side of weight sync: encode, write, announce every version; prune the bucket.

Kept apart from the training loop so that the trainer worker only calls `publish(state)` after
each step and `prune(live_versions)` now and then, and so tests and benchmarks can play the trainer.
The publisher keeps the last *published* bf16 state, the base of the next delta (see `encode`),
as a snapshot of its `Encoder`, which decides where encoding runs (`encoders`: by default a thread
of the caller; the trainer uses a process of its own).
Order matters for readers: objects are written before they are announced, and at a keyframe
version the keyframe is announced before the delta (see `announce`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping

import torch
from nats.js import JetStreamContext

from polyrl.api.naming import JobNames
from polyrl.workers.deltas.encoders import Encoder, Snapshot
from polyrl.workers.deltas.encoders.inline import InlineEncoder
from polyrl.workers.deltas.format import Blob
from polyrl.workers.weightsync import announce, chain
from polyrl.workers.weightsync.announce import (
    BASE_OBJECT,
    ObjectKind,
    Payload,
    WeightAnnouncement,
)
from polyrl.workers.weightsync.store import ObjectMeta, ObjectMissing, WeightStore


class WeightPublisher:
    def __init__(
        self,
        store: WeightStore,
        names: JobNames,
        policy: str,
        *,
        keyframe_every: int,
        epoch: int = 0,
        encoder: Encoder | None = None,
        payload: Payload = Payload.MODEL,
    ) -> None:
        chain.is_keyframe_version(0, keyframe_every)  # validates
        self.store, self.names, self.policy = store, names, policy
        self.payload = payload
        self.keyframe_every, self.epoch = keyframe_every, epoch
        self.encoder = encoder or InlineEncoder()
        self.published: Snapshot | None = None
        self.version: int | None = None

    @property
    def js(self) -> JetStreamContext:
        return self.store.js

    async def publish(
        self, state: Mapping[str, torch.Tensor], version: int | None = None, *, final: bool = False
    ) -> list[WeightAnnouncement]:
        """Publish `state` as `version` (default: the next one); returns what was announced.

        A keyframe is written when one is due, and always for the first version published, so a
        restarted trainer (a new epoch) gives replicas somewhere to start. `final` marks the
        trainer's last version (`WeightAnnouncement.final`).
        """
        version = self._next(version)
        snapshot = self.encoder.snapshot(state, keep=self.published)
        objects: list[tuple[str, ObjectKind, int | None, bytes]] = []
        if self.published is None or chain.is_keyframe_version(version, self.keyframe_every):
            blob = await asyncio.to_thread(self.encoder.keyframe, snapshot, version=version)
            objects.append((chain.keyframe_name(version), ObjectKind.KEYFRAME, None, blob))
        if self.published is not None and self.version is not None:
            blob = await asyncio.to_thread(
                self.encoder.delta,
                self.published,
                snapshot,
                base_version=self.version,
                new_version=version,
            )
            name = chain.delta_name(self.version, version)
            objects.append((name, ObjectKind.DELTA, self.version, blob))
        announced = [await self._write(version, *obj, final=final) for obj in objects]
        self.published, self.version = snapshot, version
        return announced

    async def publish_base(self, state: Mapping[str, torch.Tensor]) -> int:
        """Write the frozen base an adapter payload is served on (`BASE_OBJECT`), a keyframe
        of version 0; its size. Not announced: a replica of an adapter policy fetches it once,
        before the first adapter, and the adapters' announcements say when there is one."""
        if self.payload != Payload.ADAPTER:
            raise ValueError("only an adapter policy's publisher writes a base")
        # On a thread, not with the publisher's encoder: that one is laid out for the
        # adapter's tensors (a process encoder keeps one layout), and the base goes once.
        once = InlineEncoder()
        blob = await asyncio.to_thread(once.keyframe, once.snapshot(state, keep=None), version=0)
        return (await self.store.put(BASE_OBJECT, blob)).size

    async def prune(self, live_versions: Iterable[int], keep_keyframes: int = 2) -> list[str]:
        """Delete what no live replica (at any of `live_versions`) or new replica needs."""
        doomed = sorted(chain.to_delete(await self.store.sizes(), live_versions, keep_keyframes))
        for name in doomed:
            with contextlib.suppress(ObjectMissing):  # someone else pruned it
                await self.store.delete(name)
        return doomed

    def _next(self, version: int | None) -> int:
        if version is None:
            return 0 if self.version is None else self.version + 1
        if self.version is not None and version <= self.version:
            raise ValueError(f"version {version} is not after {self.version}")
        return version

    async def _write(
        self,
        version: int,
        name: str,
        kind: ObjectKind,
        base: int | None,
        blob: bytes,
        *,
        final: bool = False,
    ) -> WeightAnnouncement:
        meta = await self.store.put(name, blob)
        return await self.announce_parts(version, name, kind, base, [meta], final=final)

    async def put_part(self, name: str, index: int, count: int, blob: Blob) -> ObjectMeta:
        """Write part `index` of `count` of the object `name` (a sharded trainer's rank's
        rows, `pieces`); announced with its siblings once all are written."""
        return await self.store.put(chain.part_name(name, index, count), blob)

    async def announce_parts(
        self,
        version: int,
        name: str,
        kind: ObjectKind,
        base: int | None,
        parts: list[ObjectMeta],
        *,
        final: bool = False,
    ) -> WeightAnnouncement:
        """Say that the object `name`, written as `parts` (in order), is complete."""
        announcement = WeightAnnouncement(
            policy=self.policy,
            version=version,
            epoch=self.epoch,
            base_version=base,
            kind=kind,
            object=name,
            payload=self.payload,
            size=sum(meta.size for meta in parts),
            checksum=",".join(meta.digest for meta in parts),
            parts=len(parts),
            final=final,
        )
        await announce.publish(self.js, self.names, announcement)
        return announcement
