"""A benchmark part: the weight source of a simulated replica, following versions alone.

A simulated engine (`engines.simulated_engine`) has no weights, and a simulated trainer
(`trainer.simulated`) announces versions without objects behind them; what matters to the
system around them is *when* a replica serves a new version, since requests wait for the
version they need (`GenerationRequest.min_version`) and sync mode's rounds wait for all.
So this source reads the policy's announcements as `weights.EngineWeights` does, waits the
modelled sync time (`sync_seconds`, divided by `compression`) and sets the engine's version.
"""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext

from polyrl.api.naming import JobNames
from polyrl.workers.rollout.engines.base import Engine
from polyrl.workers.weightsync import announce


class AnnouncedVersions:
    """`worker.WeightSource` for simulated engines."""

    def __init__(
        self,
        js: JetStreamContext,
        names: JobNames,
        policy: str,
        *,
        sync_seconds: float = 0.0,
        compression: float = 1.0,
    ) -> None:
        self.js, self.names, self.policy = js, names, policy
        self.sync_seconds, self.compression = sync_seconds, compression
        self._version: int | None = None
        self.syncs = 0

    @property
    def version(self) -> int | None:
        return self._version

    async def update(self, engine: Engine) -> int | None:
        latest = await announce.latest(self.js, self.names, self.policy)
        if latest is None or latest.version == self._version:
            return None
        if self.sync_seconds:
            await asyncio.sleep(self.sync_seconds / self.compression)
        self._version = engine.version = latest.version
        self.syncs += 1
        return latest.version

    def figures(self) -> dict[str, float | int | None]:
        return {"sync_seconds": self.sync_seconds, "sync_bytes": 0}

    async def close(self) -> None:
        """Nothing held."""
