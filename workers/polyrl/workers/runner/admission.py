"""When the workflow runner may start an episode, and which weights its requests need.

Generation must not run away from training. How it is held back depends on the job's mode,
and the episode loop should not have to know which: in async mode the staleness gate
(`staleness`) holds each request until its policy's trainer can take the samples within
`maxStaleness`, and says which policies are catching up before an episode starts; in sync mode
the round gate (`rounds`) admits just enough episodes for a round and stamps every request with
the round's versions. `Admission` puts the one the job's mode needs behind the same few calls,
fed by what the runner knows of the trainers (`trainers`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from polyrl.api.resources import Mode, RLJobSpec
from polyrl.workers.runner import rounds, staleness, trainers
from polyrl.workers.workflows.episode import Episode


class Admission:
    """Admits episodes and requests: by rounds (`gate`, sync mode) or staleness (async)."""

    def __init__(self, spec: RLJobSpec, watch: trainers.TrainerWatch) -> None:
        self.policies = [p.name for p in spec.policies]
        batches = {p.name: p.trainer.batch_size for p in spec.trained()}  # frozen: unbounded
        self.gate: rounds.RoundGate | None = None
        self.staleness: staleness.StalenessGate | None = None
        if spec.algorithm.mode == Mode.SYNC:
            need = rounds.per_runner_need(batches, spec.workflow.replicas)
            self.gate = rounds.RoundGate(need, watch.latest_versions)
        else:
            self.staleness = staleness.StalenessGate(
                batches,
                max_staleness=spec.algorithm.max_staleness,
                backlog=watch.backlog,
                runners=spec.workflow.replicas,
                finished=watch.finished,
                versions=watch.versions,
            )

    @property
    def waited(self) -> float:
        """Seconds requests waited, in all, for trainers to catch up (async mode)."""
        return self.staleness.waited if self.staleness is not None else 0.0

    async def refresh(self) -> None:
        """Read the backlogs, for `catching_up`: before an episode is made."""
        if self.staleness is not None:
            await self.staleness.refresh()

    def catching_up(self) -> frozenset[str]:
        """Policies asked for all the samples their trainers can take within maxStaleness."""
        if self.staleness is None:
            return frozenset()
        return frozenset(p for p in self.policies if not self.staleness.has_room(p))

    async def admit(self) -> None:
        """Wait until another episode may start (sync mode's rounds; at once otherwise)."""
        if self.gate is not None:
            await self.gate.admit()

    async def done(self, episode: Episode) -> None:
        """An episode admitted ended, however, with what it emitted (`episode.rewards`)."""
        if self.gate is not None:
            await self.gate.done({p: len(r) for p, r in episode.rewards.items()})

    @contextlib.asynccontextmanager
    async def asking(self, policy: str, n: int) -> AsyncIterator[int]:
        """Around one request for `n` samples of `policy`, once it may be asked (async mode):
        the oldest weight version they may come from, the round's (sync mode) or the staleness
        bound's (async)."""
        if self.staleness is None:
            yield self.gate.min_version(policy) if self.gate is not None else 0
            return
        oldest = await self.staleness.reserve(policy, n)
        try:
            yield oldest
        finally:
            self.staleness.answered(policy, n)
