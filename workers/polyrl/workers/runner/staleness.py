"""Async mode's bound on how far generation runs ahead of training.

Trainers drop samples older than `maxStaleness` versions, but dropping is the last resort: the
samples were generated, on machines the trainers share, for nothing, and the ones that survive
are as stale as the bound allows. On the quick start, where generation outpaces training, the
trainers' samples were 3.7-3.9 versions old on average (bound 4), the verifier's trainer dropped
more samples than it trained on, and the solver learnt more slowly per step than with fresh
samples. So, like AReaL's rollout controller, the workflow runner asks a policy for more samples
only while its trainer's queue can take them within the bound:

    backlog(p) + in_flight(p) + n <= (maxStaleness + 1) * batch(p)

`backlog` is what the policy's trajectory stream holds that its trainer has not acknowledged
(the batch being trained included: the trainer acknowledges after its step), `in_flight` the
samples this runner asked for and has no answer to yet, `batch` the trainer's batch size. A
sample asked for now is trained within maxStaleness + 1 steps, the one under way included.

The bound is on what is queued, not on what was ever asked for, so it cannot deadlock: samples
a trainer drops, episodes that fail and workflows that emit fewer samples than they asked for
all leave the backlog. With several workflow runners each counts the shared backlog by its
share (`runners`), and its own requests in flight.

A finished policy (its final version announced) is never waited for: its trainer will not
catch up, and the workflows that ask it anyway get what they asked for.

The bound on the queue alone did not keep samples fresh: the quick start's trainers still
dropped about a quarter of what was generated for them (the solver 58 and the verifier 60
samples a step, 256 a batch), nearly all exactly one version too old. A rollout worker serves
the weights it has, and the trainer's newest version is still being published (encoded,
uploaded, fetched) while requests for the batches behind the current one are already asked.
So each request also says which weights it needs (`GenerationRequest.min_version`, which a
rollout worker holds a request back for): a sample that will sit in the k-th batch after the
one the trainer trains from version T (its heartbeat says T at once, before it acknowledges the
batch before) is trained from version T + k, so it needs at least T + k - maxStaleness. A
request for the last batch the bound allows waits for version T to land instead of being
generated for nothing; one for a nearer batch takes what the rollout worker has.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from collections.abc import Set as AbstractSet

Backlog = Callable[[str], Awaitable[int]]
"""A policy's trajectories its trainer has not acknowledged yet."""


class StalenessGate:
    """Whether a policy may be asked for more samples now; waits where it may not."""

    def __init__(
        self,
        batches: Mapping[str, int],
        *,
        max_staleness: int,
        backlog: Backlog,
        runners: int = 1,
        poll: float = 0.1,
        finished: AbstractSet[str] = frozenset(),
        versions: Mapping[str, int] | None = None,
    ) -> None:
        self.batches = dict(batches)
        self.max_staleness = max_staleness
        self.limits = {p: (max_staleness + 1) * b for p, b in batches.items()}
        self.backlog = backlog
        self.runners = max(1, runners)
        self.poll = poll
        self.backlogs: dict[str, int] = {}
        self.checked: dict[str, float] = {}
        self.in_flight: Counter[str] = Counter()
        self.unread: Counter[str] = Counter()  # answered since the backlog was last read
        self.finished = finished  # read, never changed: the runner's own set, kept current
        # Each policy's version its trainer trains from (read, never changed; as `finished`).
        self.versions: Mapping[str, int] = versions if versions is not None else {}
        self.waited = 0.0  # seconds requests waited for room, summed over requests
        self._locks: dict[str, asyncio.Lock] = {}

    def queued(self, policy: str) -> float:
        """`policy`'s samples queued for its trainer, asked for, or on their way."""
        return (
            self.backlogs.get(policy, 0) / self.runners
            + self.in_flight[policy]
            + self.unread[policy]
        )

    def has_room(self, policy: str, n: int = 1) -> bool:
        """Whether `n` more samples of `policy` fit (always, for a policy not trained here).

        One request larger than the whole allowance still goes once nothing is queued."""
        if policy not in self.limits or policy in self.finished:
            return True
        queued = self.queued(policy)
        return queued == 0 or queued + n <= self.limits[policy]

    def min_version(self, policy: str) -> int:
        """The oldest weights a sample of `policy` asked for now may come from: it lands in
        the batch `queued // batch` after the one its trainer trains from `versions[policy]`,
        and is trained from that many versions later (0: no bound, as for a finished policy)."""
        if policy not in self.limits or policy in self.finished:
            return 0
        ahead = int(self.queued(policy) // self.batches[policy])
        return max(0, self.versions.get(policy, 0) + ahead - self.max_staleness)

    async def reserve(self, policy: str, n: int) -> int:
        """Wait until `n` samples of `policy` fit, then count them as in flight; the oldest
        weight version they may be generated with (`min_version`)."""
        started = time.monotonic()
        while True:
            await self._refresh(policy)
            if self.has_room(policy, n):
                break
            await asyncio.sleep(self.poll)
        self.waited += time.monotonic() - started
        oldest = self.min_version(policy)
        self.in_flight[policy] += n
        return oldest

    def answered(self, policy: str, n: int) -> None:
        """The request for `n` samples got its answer, or gave up: no longer in flight.

        Until the backlog is read again they still count, as the trajectories on their way
        into it (the workflow emits them after scoring)."""
        self.in_flight[policy] -= n
        self.unread[policy] += n

    async def refresh(self) -> None:
        """Read every policy's backlog (each at most once per `poll` seconds).

        Whoever decides whether to ask a policy at all (`has_room`) must call this first: a
        policy nobody asks never goes through `reserve`, which otherwise reads the backlog."""
        for policy in self.limits:
            await self._refresh(policy)

    async def _refresh(self, policy: str) -> None:
        """Read the backlog, at most once per `poll` seconds per policy."""
        if policy not in self.limits or policy in self.finished:
            return
        lock = self._locks.setdefault(policy, asyncio.Lock())
        async with lock:
            if time.monotonic() - self.checked.get(policy, float("-inf")) < self.poll:
                return
            unread = self.unread[policy]
            self.backlogs[policy] = await self.backlog(policy)
            self.unread[policy] -= unread  # the backlog read now holds them (or lost them)
            self.checked[policy] = time.monotonic()
