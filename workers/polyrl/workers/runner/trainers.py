"""What the workflow runner knows of the trainers: announcements, heartbeats and backlogs.

Whom to ask for samples, and how many, depends on the trainers the samples are for, which the
runner never talks to: it reads what they publish. Their weight announcements say which
trainers are still warming up (nothing announced yet) and which are done (their final version
announced); their heartbeats say the version each trains from; their consumers on the
trajectory streams say how much they have not taken yet. Episodes read the first two
(`Episode.warming`, `Episode.finished`), the admission gates all three (`admission`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pydantic import ValidationError

from polyrl.api.messages import Heartbeat
from polyrl.api.naming import JobNames
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.weightsync import announce

log = logging.getLogger("polyrl.workflow")

TRAINERS_POLL_SECONDS = 2.0
VERSIONS_READ_SECONDS = 5.0  # at most this long for the trainers' heartbeats at the start


class TrainerWatch:
    """Keeps `finished`, `warming` and `versions` current while the runner runs."""

    def __init__(self, rt: Runtime, *, async_mode: bool) -> None:
        self.rt = rt
        self.finished: set[str] = set()  # policies whose trainers are done
        # The version each policy's trainer trains from, from its heartbeats (`watch_versions`)
        self.versions: dict[str, int] = {}
        self.versions_read = asyncio.Event()  # the heartbeats there were at the start are read
        # policies whose trainers announced no weights yet (see `poll`)
        self.warming = {p.name for p in rt.config.spec.policies} if async_mode else set()
        self.weights_out: dict[str, asyncio.Event] = {}  # set as a policy leaves `warming`

    async def start(self, *, versions: bool) -> list[asyncio.Task[None]]:
        """Poll once, so the first episodes already know, then keep watching (the tasks to
        cancel); with `versions`, also watch the heartbeats and read the ones there are, so
        the first requests already know (a runner restarted)."""
        await self.poll()
        watchers = [asyncio.create_task(self.watch())]
        if versions:
            watchers.append(asyncio.create_task(self.watch_versions()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.versions_read.wait(), VERSIONS_READ_SECONDS)
        return watchers

    async def announced(self, policy: str) -> None:
        """Return once `policy` has weights out (at once in sync mode, or once the runner
        stops). A request sent before would wait in its queue for a warm-up that can outlast
        the request's timeout and retries (minutes for a pretrained model), and its episode
        would be dropped for want of an answer."""
        out = self.weights_out.setdefault(policy, asyncio.Event())
        if policy not in self.warming:
            out.set()
        if out.is_set():
            return
        waits = [asyncio.ensure_future(out.wait()), asyncio.ensure_future(self.rt.stopping.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def backlog(self, policy: str) -> int:
        """Trajectories of `policy` its trainer has not acknowledged (0 if that is unknown)."""
        try:
            info = await self.rt.js.consumer_info(
                self.rt.names.trajectories_stream(policy), JobNames.trainer_consumer
            )
        except Exception as err:  # no trainer consumer yet (warming up), or reconnecting
            log.debug("backlog of %s: %s", policy, err)
            return 0
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def latest(self) -> dict[str, announce.WeightAnnouncement | None]:
        """Every policy's newest weight announcement (None before its first)."""
        names = [policy.name for policy in self.rt.config.spec.policies]
        return {
            name: await announce.latest(
                self.rt.js, self.rt.names, name, malformed=self.rt.malformed_announcements(name)
            )
            for name in names
        }

    async def latest_versions(self) -> dict[str, int]:
        return {p: a.version if a is not None else 0 for p, a in (await self.latest()).items()}

    async def watch(self) -> None:
        """Keep `finished` and `warming` current (`Episode.finished`, `Episode.warming`)."""
        while not self.rt.stopping.is_set():
            await asyncio.sleep(TRAINERS_POLL_SECONDS)
            await self.poll()

    async def watch_versions(self) -> None:
        """Keep `versions` current from the trainers' heartbeats, which a trainer puts the
        moment it starts on a new version (`staleness`). The last heartbeat put wins: a
        policy has one trainer heartbeating (its rank 0), and a replaced pod's last one, which
        the watch may deliver first, is overwritten by the live trainer's next."""
        pattern = JobNames.heartbeat_key("*", "trainer", ">")
        while not self.rt.stopping.is_set():
            try:
                watcher = await self.rt.kv.watch(pattern)
                try:
                    async for entry in watcher:
                        if entry is None:  # the end of the values there were
                            self.versions_read.set()
                        elif entry.value and entry.operation not in ("DEL", "PURGE"):
                            self._note_version(entry.key, entry.value)
                finally:
                    with contextlib.suppress(Exception):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except Exception as err:  # e.g. reconnecting
                log.debug("trainer heartbeats: %s", err)
            await asyncio.sleep(TRAINERS_POLL_SECONDS)  # then watch again

    def _note_version(self, key: str, value: bytes) -> None:
        try:
            beat = Heartbeat.model_validate_json(value)
        except ValidationError:
            log.warning("malformed heartbeat under %s ignored", key)
            return
        if beat.policy is not None:
            self.versions[beat.policy] = beat.weight_version

    async def poll(self) -> None:
        """Note which trainers are done (final version announced) and which still warm up.

        A done trainer's samples would go nowhere: on the quick start the verifier reaches its
        last step minutes before the solver, and judging for it cost its rollout worker more
        than the solver's own generation. A trainer that announced nothing yet is still in its
        warm-up: an episode asking its policy would wait for it, and on the quick start that
        held the solver's RL back by the 35 s the verifier's warm-up takes longer. Sync mode's
        rounds wait for every policy anyway, so there no policy counts as warming.
        """
        try:
            announced = await self.latest()
        except Exception as err:  # e.g. reconnecting: ask again next time
            log.debug("latest announcements: %s", err)
            return
        for policy, latest in announced.items():
            if latest is None:
                continue
            if policy in self.warming:
                log.info("%s's trainer announced its first weights: asking it for samples", policy)
                self.warming.discard(policy)
                self.weights_out.setdefault(policy, asyncio.Event()).set()
            done = latest.final
            if done and policy not in self.finished:
                log.info("%s's trainer is done (its final version announced)", policy)
                self.finished.add(policy)
            elif not done and policy in self.finished:  # a trainer started again
                log.info("%s's trainer publishes again", policy)
                self.finished.discard(policy)
