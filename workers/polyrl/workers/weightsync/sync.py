"""The replica's side of weight sync: bring a state dict to the latest version, never to bad bits.

A rollout worker holds a state dict and the version it is at, and between requests calls
`await sync.to(latest)` (or `sync.follow(announcement)`). The plan comes from `chain.plan_sync`
over the bucket's listing; a replica that holds exactly the announced delta's base skips the
listing and fetches that one object. Objects are fetched one ahead of the one being applied, and
applied on a thread so the event loop keeps the NATS connection alive.

Any refusal (the codec's `DeltaError`s: corrupt, wrong base, checksum; the store's missing or
corrupt object; an object that turns out to hold another version than its name says) is counted
in `refusals` and answered the same way: plan again from a keyframe, leaving out the refused object
if it was at fault (a wrong base or a checksum mismatch says the state dict, not the object, is not
what its version claims, and the keyframe repairs that). The codec applies all or nothing, so
whatever happens the state dict holds verified weights of `version`: the version before the
refused object, or a later one. If the keyframe path fails as well, `SyncFailed` is raised and
the state dict is still as good as its `version` says.

An object in parts (a sharded trainer's, `pieces`) is fetched whole, every part checked, then
applied part by part to row views of the state dict. A part refused after an earlier one was
applied leaves a mix of two versions: the version becomes unknown (None) and the resync
starts from a keyframe, as after an epoch change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

import torch

from polyrl.workers.deltas import decode, errors, format
from polyrl.workers.weightsync import chain, pieces
from polyrl.workers.weightsync.announce import ObjectKind, WeightAnnouncement
from polyrl.workers.weightsync.store import WeightObjectError, WeightStore

State = dict[str, torch.Tensor]
Plan = dict[str, tuple[str, ...]]  # objects to apply, in order, each with its stored parts


class SyncFailed(Exception):
    """No way to the latest version worked, keyframe included.

    The state dict still holds verified weights of the sync's `version` (None: unknown, as after
    an epoch change), so the replica can keep serving them and try again later.
    """


@dataclasses.dataclass(slots=True)
class SyncReport:
    version: int | None
    applied: list[str]
    bytes: int
    seconds: float
    refused: list[str]
    changed: int = 0  # elements the applied deltas rewrote (keyframes not counted)
    elements: int = 0  # elements the applied deltas cover

    @property
    def changed_fraction(self) -> float | None:
        """Share of the weights the applied deltas rewrote; None after keyframes alone."""
        return self.changed / self.elements if self.elements else None


class WeightSync:
    def __init__(
        self,
        store: WeightStore,
        *,
        state: State | None = None,
        version: int | None = None,
        epoch: int | None = None,
        workers: int | None = None,
    ) -> None:
        if (state is None) != (version is None):
            raise ValueError("give both a state dict and its version, or neither")
        self.store = store
        self.state, self.version, self.epoch = state, version, epoch
        self.workers = workers
        self.refusals = 0
        self.last_refusal: str | None = None

    async def follow(self, announcement: WeightAnnouncement) -> SyncReport:
        """Sync to the announced version; the announced delta alone if it starts where we are."""
        hint = None
        if (
            announcement.kind == ObjectKind.DELTA
            and announcement.base_version == self.version
            and announcement.epoch == self.epoch
        ):
            name = announcement.object
            hint = {name: tuple(chain.part_names(name, announcement.parts))}
        return await self.to(announcement.version, epoch=announcement.epoch, plan=hint)

    async def to(
        self, latest: int, *, epoch: int | None = None, plan: Plan | None = None
    ) -> SyncReport:
        """Bring the state dict to `latest`; `epoch` other than ours means start from a keyframe.
        `plan`: the objects to apply, in order, each with its stored parts."""
        started = time.perf_counter()
        report = SyncReport(self.version, [], 0, 0.0, [])
        if epoch is not None and epoch != self.epoch:
            self.version, self.epoch = None, epoch  # keep the tensors, not the version number
        if self.version != latest:
            try:
                if plan is None:
                    plan = await self._plan(self.version, latest)
                await self._apply_all(plan, report)
            except _Refused as refused:
                await self._resync(refused, latest, report)
            except chain.NoPath as err:
                raise SyncFailed(str(err)) from err
        report.version, report.seconds = self.version, time.perf_counter() - started
        return report

    async def _resync(self, refused: _Refused, latest: int, report: SyncReport) -> None:
        self._count(refused, report)
        avoid = [refused.name] if refused.object_at_fault else []
        try:
            plan = await self._plan(None, latest, avoid=avoid)
            await self._apply_all(plan, report)
        except _Refused as again:
            self._count(again, report)
            raise SyncFailed(f"to version {latest}: {again}, after {refused}") from again
        except chain.NoPath as err:
            raise SyncFailed(f"to version {latest}: {err}, after {refused}") from err

    async def _plan(self, have: int | None, latest: int, avoid: list[str] | None = None) -> Plan:
        objects = chain.fold(await self.store.sizes())
        names = chain.plan_sync(have, latest, chain.sizes(objects), avoid=avoid or ())
        return {name: objects[name].parts for name in names}

    def _count(self, refused: _Refused, report: SyncReport) -> None:
        self.refusals += 1
        self.last_refusal = str(refused)
        report.refused.append(refused.name)

    async def _apply_all(self, plan: Plan, report: SyncReport) -> None:
        names = list(plan)
        fetching = asyncio.create_task(self._get(plan[names[0]])) if names else None
        try:
            for i, name in enumerate(names):
                assert fetching is not None
                try:
                    blobs = await fetching
                    following = names[i + 1] if i + 1 < len(names) else None
                    fetching = (
                        asyncio.create_task(self._get(plan[following])) if following else None
                    )
                    header = await asyncio.to_thread(self._apply, name, blobs)
                except (errors.DeltaError, WeightObjectError) as err:
                    raise _Refused(name, err) from err
                if not header.is_keyframe:
                    report.changed += sum(map(_rewritten, header.tensors))
                    report.elements += sum(math.prod(t.shape) for t in header.tensors)
                report.applied.append(name)
                report.bytes += sum(map(len, blobs))
        finally:
            if fetching is not None:
                fetching.cancel()
                await asyncio.gather(fetching, return_exceptions=True)

    async def _get(self, parts: tuple[str, ...]) -> list[memoryview]:
        """An object's parts, one after the other: reads of large objects side by side
        overran the bulk connection (the server dropped chunks of one of them, a keyframe of
        SmolLM2 in two parts), and one at a time the link is as busy."""
        return [await self.store.get(part) for part in parts]

    def _apply(self, name: str, blobs: list[memoryview]) -> format.Header:
        expected = chain.parse(name)
        if len(blobs) > 1:
            header = self._apply_parts(blobs)
        elif self.state is None:
            header, self.state = decode.load_keyframe(blobs[0], self.workers)
        else:
            header = decode.apply_delta(
                self.state, blobs[0], have_version=self.version, workers=self.workers
            )
        self.version = header.new_version  # verified weights of this version, whatever the name
        if expected is None or header.new_version != expected.version:
            raise errors.CorruptDelta(f"{name} holds version {header.new_version}")
        return header

    def _apply_parts(self, blobs: list[memoryview]) -> format.Header:
        """Apply an object's parts (all checked first) to row views of the state."""
        header, self.state, targets = pieces.prepare(self.state, blobs, have_version=self.version)
        try:
            pieces.apply(blobs, targets, have_version=self.version, workers=self.workers)
        except errors.DeltaError:
            self.version = None  # some parts may have applied: a mix of two versions
            raise
        return header


def _rewritten(entry: format.TensorEntry) -> int:
    """Elements a delta entry rewrites: its changed ones (sparse), all of them (whole)."""
    if entry.kind is format.Kind.SPARSE:
        return entry.count
    return math.prod(entry.shape) if entry.kind is format.Kind.WHOLE else 0


class _Refused(Exception):
    def __init__(self, name: str, cause: Exception) -> None:
        super().__init__(f"{name} refused: {type(cause).__name__}: {cause}")
        self.name = name
        # A wrong base or a checksum mismatch says the *target* differs from what its version
        # claims; the object is sound and the keyframe's chain may use it.
        self.object_at_fault = not isinstance(
            cause, errors.BaseVersionMismatch | errors.ChecksumMismatch
        )
