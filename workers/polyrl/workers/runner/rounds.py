"""`algorithm.mode: sync`: generate one batch, train on it, sync the weights, repeat.

The verl-style baseline the asynchronous mode is measured against (`polyrl bench pipeline`).
Nothing else changes: the same workers, queues and trainer. Two small gates make it
synchronous:

* the **trainer** only takes samples of its current version (staleness 0) and waits for its
  new weights to be published before pulling the next batch;
* the **workflow runner** works in rounds: in a round it starts just enough episodes to give
  each trained policy one batch (`RoundGate.admit`), stamps every generation request with the
  round's weight versions (`min_version`: a rollout worker holds such a request back until it
  serves those weights), and then waits until every policy has announced a newer version.

If a round falls short (an episode failed, a trajectory was lost), no new version comes; after
`round_timeout` the runner runs another round at the same versions rather than wait forever.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

log = logging.getLogger("polyrl.sync")

LatestVersions = Callable[[], Awaitable[Mapping[str, int]]]


class RoundGate:
    """Admits episodes until the round's batches are covered, then waits for new weights.

    `need` is how many trajectories each trained policy needs per round from this runner.
    How many one episode yields per policy is learnt from the first episode of the job
    (workflows are free to emit any number), so the first round starts one episode, waits
    for it, and then as many as the yields say are still needed.
    """

    def __init__(
        self,
        need: Mapping[str, int],
        latest: LatestVersions,
        *,
        round_timeout: float = 60.0,
        poll: float = 0.1,
    ) -> None:
        self.need = {p: n for p, n in need.items() if n > 0}
        self.latest = latest
        self.round_timeout = round_timeout
        self.poll = poll
        self.versions: dict[str, int] = {}
        self.emitted: Counter[str] = Counter()
        self.yields: dict[str, int] | None = None
        self.in_flight = 0
        self.rounds = 0
        self.waited = 0.0  # seconds spent waiting for weights (the runner is idle then)
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()

    def min_version(self, policy: str) -> int:
        return self.versions.get(policy, 0)

    def _covered(self) -> bool:
        """Would the round's batches be full once the episodes in flight are done?"""
        for policy, need in self.need.items():
            expected = self.in_flight * (self.yields or {}).get(policy, 0)
            if self.emitted[policy] + expected < need:
                return False
        return True

    async def admit(self) -> None:
        """Wait until another episode of the current round may start."""
        async with self._changed:
            while True:
                if not self.versions:
                    self.versions = dict(await self.latest())
                    self.rounds = 1
                first_unknown = self.yields is None and self.in_flight > 0
                if not first_unknown and not self._covered():
                    self.in_flight += 1
                    return
                if self.in_flight == 0:  # round covered and nothing in flight: next round
                    await self._next_round()
                    continue
                await self._changed.wait()

    async def done(self, emitted: Mapping[str, int]) -> None:
        """An admitted episode finished (or failed) having emitted `emitted` per policy."""
        async with self._changed:
            self.in_flight -= 1
            self.emitted.update(emitted)
            if self.yields is None and any(emitted.values()):
                self.yields = dict(emitted)
            self._changed.notify_all()

    async def _next_round(self) -> None:
        """Wait until every trained policy announced a version newer than this round's."""
        started = time.monotonic()
        deadline = started + self.round_timeout
        while True:
            latest = await self.latest()
            if all(latest.get(p, -1) > self.versions.get(p, -1) for p in self.need):
                break
            if time.monotonic() > deadline:
                log.warning(
                    "round %d: no new weights after %.0f s (emitted %s); another round at %s",
                    self.rounds,
                    self.round_timeout,
                    dict(self.emitted),
                    self.versions,
                )
                break
            await asyncio.sleep(self.poll)
        self.waited += time.monotonic() - started
        self.versions = dict(latest)
        self.emitted.clear()
        self.rounds += 1


def per_runner_need(batch_sizes: Mapping[str, int], replicas: int) -> dict[str, int]:
    """Each of `replicas` workflow runners covers its share of every policy's batch."""
    return {p: math.ceil(b / max(1, replicas)) for p, b in batch_sizes.items()}
