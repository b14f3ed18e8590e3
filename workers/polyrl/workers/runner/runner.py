"""The workflow runner: runs episodes, `episodesInFlight` at a time, and feeds the trainers.

Each of its concurrent loops runs one episode after another through the job's workflow.
Generation requests go to the policies' work queues with a reply subject private to this
runner; responses are matched to their request by id. A request unanswered within
`request_timeout` is retried under a fresh id (the work queue de-duplicates by id, so the
same id would be swallowed). On SIGTERM no new episode starts; those in flight get
`drain_timeout` to finish, and whatever they had not emitted is simply not sent, so no
half-written episode reaches a trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
import time
import uuid
from typing import Any

from nats.aio.msg import Msg
from nats.js.errors import APIError
from pydantic import ValidationError

from polyrl.api import natsconfig
from polyrl.api.messages import Heartbeat, WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.resources import Mode, UniformGroups
from polyrl.api.wire import GenerationRequest, GenerationResponse, Trajectory
from polyrl.workers.errors import StorageFull
from polyrl.workers.models.prompts import Prompt, PromptError
from polyrl.workers.runner.reward_health import RewardHealth, RewardsFailing
from polyrl.workers.runner.rounds import RoundGate, per_runner_need
from polyrl.workers.runner.staleness import StalenessGate
from polyrl.workers.runner.tokenizers import Tokenizers
from polyrl.workers.runner.uniform_groups import HeldGroups, LeaveOut
from polyrl.workers.runtime import outage
from polyrl.workers.runtime.worker import MetricsLog, Runtime
from polyrl.workers.weightsync import announce
from polyrl.workers.workflows.episode import Episode, nothing_held
from polyrl.workers.workflows.interface import Reports, Workflow

log = logging.getLogger("polyrl.workflow")


class GenerationTimeout(RuntimeError):
    """No rollout worker answered a request after every retry."""


class GenerationRefused(PromptError):
    """A rollout worker answered with an error: the request's ids do not fit its model."""


TRAINERS_POLL_SECONDS = 2.0
VERSIONS_READ_SECONDS = 5.0  # at most this long for the trainers' heartbeats at the start


class WorkflowRunner:
    def __init__(
        self,
        rt: Runtime,
        workflow: Workflow,
        task: Any,
        *,
        concurrency: int,
        request_timeout: float = 120.0,
        retries: int = 3,
        drain_timeout: float = 20.0,
    ) -> None:
        self.rt = rt
        self.workflow = workflow
        self.task = task
        self.concurrency = concurrency
        self.request_timeout = request_timeout
        self.retries = retries
        self.drain_timeout = drain_timeout
        self.inbox = f"{rt.names.prefix}.replies.{rt.pod}"
        self.waiting: dict[str, asyncio.Future[GenerationResponse]] = {}
        self.counter = itertools.count()
        # Request ids are message ids the request stream deduplicates for two minutes: a runner
        # that replaces a killed one under the same pod name must not reuse its ids.
        self.boot = uuid.uuid4().hex[:8]
        self.episodes = 0
        self.failed = 0
        self.dropped_prompts = 0  # episodes whose prompt a policy could not take
        self.dropped_samples = 0  # samples whose reward failed (`Episode.drop`)
        self.reward_health = RewardHealth()
        self.fatal: Exception | None = None  # why the runner stopped by itself
        self.tokenizers = Tokenizers(rt)
        self.recent: dict[str, list[float]] = {}
        self.finished: set[str] = set()  # policies whose trainers are done
        # The version each policy's trainer trains from, from its heartbeats (`_watch_versions`)
        self.trainer_versions: dict[str, int] = {}
        self.versions_read = asyncio.Event()  # the heartbeats there were at the start are read
        async_mode = rt.config.spec.algorithm.mode != Mode.SYNC
        # policies whose trainers announced no weights yet (see `_poll_trainers`)
        self.warming = {p.name for p in rt.config.spec.policies} if async_mode else set()
        self.metrics = MetricsLog.from_env()
        self.gate = self._sync_gate() if rt.config.spec.algorithm.mode == Mode.SYNC else None
        self.staleness = self._staleness_gate() if async_mode else None
        self.started = time.monotonic()
        self.in_episode: set[int] = set()  # loops running an episode right now
        # Policies whose uniform groups are not sent (`uniform_groups`). Sync mode's rounds need their
        # batches from a fixed number of episodes: there the trainers leave them out instead.
        refill = {
            p.name
            for p in rt.config.spec.policies
            if async_mode and p.trainer.uniform_groups == UniformGroups.REFILL
        }
        self.leave_out = LeaveOut(refill)

    def _sync_gate(self) -> RoundGate:
        spec = self.rt.config.spec
        batches = {p.name: p.trainer.batch_size for p in spec.policies}
        return RoundGate(per_runner_need(batches, spec.workflow.replicas), self._latest_versions)

    def _staleness_gate(self) -> StalenessGate:
        spec = self.rt.config.spec
        batches = {p.name: p.trainer.batch_size for p in spec.policies}
        return StalenessGate(
            batches,
            max_staleness=spec.algorithm.max_staleness,
            backlog=self._backlog,
            runners=spec.workflow.replicas,
            finished=self.finished,
            versions=self.trainer_versions,
        )

    async def _backlog(self, policy: str) -> int:
        """Trajectories of `policy` its trainer has not acknowledged (0 if that is unknown)."""
        try:
            info = await self.rt.js.consumer_info(
                self.rt.names.trajectories_stream(policy), JobNames.trainer_consumer
            )
        except Exception as err:  # no trainer consumer yet (warming up), or reconnecting
            log.debug("backlog of %s: %s", policy, err)
            return 0
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def _latest(self) -> dict[str, announce.WeightAnnouncement | None]:
        """Every policy's newest weight announcement (None before its first)."""
        names = [policy.name for policy in self.rt.config.spec.policies]
        return {
            name: await announce.latest(
                self.rt.js, self.rt.names, name, malformed=self.rt.malformed_announcements(name)
            )
            for name in names
        }

    async def _latest_versions(self) -> dict[str, int]:
        return {p: a.version if a is not None else 0 for p, a in (await self._latest()).items()}

    async def _watch_trainers(self) -> None:
        """Keep `finished` and `warming` current (`Episode.finished`, `Episode.warming`)."""
        while not self.rt.stopping.is_set():
            await asyncio.sleep(TRAINERS_POLL_SECONDS)
            await self._poll_trainers()

    async def _watch_versions(self) -> None:
        """Keep `trainer_versions` current from the trainers' heartbeats, which a trainer puts
        the moment it starts on a new version (`staleness`). The last heartbeat put wins: a
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
            self.trainer_versions[beat.policy] = beat.weight_version

    async def _poll_trainers(self) -> None:
        """Note which trainers are done (final version announced) and which still warm up.

        A done trainer's samples would go nowhere: on the quick start the verifier reaches its
        last step minutes before the solver, and judging for it cost its rollout worker more
        than the solver's own generation. A trainer that announced nothing yet is still in its
        warm-up: an episode asking its policy would wait for it, and on the quick start that
        held the solver's RL back by the 35 s the verifier's warm-up takes longer. Sync mode's
        rounds wait for every policy anyway, so there no policy counts as warming.
        """
        try:
            announced = await self._latest()
        except Exception as err:  # e.g. reconnecting: ask again next time
            log.debug("latest announcements: %s", err)
            return
        for policy, latest in announced.items():
            if latest is None:
                continue
            if policy in self.warming:
                log.info("%s's trainer announced its first weights: asking it for samples", policy)
                self.warming.discard(policy)
            done = latest.final
            if done and policy not in self.finished:
                log.info("%s's trainer is done (its final version announced)", policy)
                self.finished.add(policy)
            elif not done and policy in self.finished:  # a trainer started again
                log.info("%s's trainer publishes again", policy)
                self.finished.discard(policy)

    async def run(self) -> None:
        await self.rt.nc.subscribe(self.inbox, cb=self._on_reply)
        await self.rt.enter(WorkerState.SERVING)
        await self._poll_trainers()  # so the first episodes already know
        watchers = [asyncio.create_task(self._watch_trainers())]
        if self.staleness is not None:  # so the first requests already know (a runner restarted)
            watchers.append(asyncio.create_task(self._watch_versions()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.versions_read.wait(), VERSIONS_READ_SECONDS)
        loops = [asyncio.create_task(self._loop(i)) for i in range(self.concurrency)]
        await self.rt.stopping.wait()
        for watcher in watchers:
            watcher.cancel()
        self.rt.state = WorkerState.DRAINING
        for index, task in enumerate(loops):  # not in an episode (sync mode's gate): stop now
            if index not in self.in_episode:
                task.cancel()
        _, pending = await asyncio.wait(loops, timeout=self.drain_timeout)
        for task in pending:
            task.cancel()
        if isinstance(self.workflow, Reports):
            self._write_metrics(self.workflow.flush())
        self._log_stopped(pending)
        if self.fatal is not None:
            raise self.fatal

    def _stop(self, err: Exception) -> None:
        """Stop the runner: `run` raises `err` (the first such) once the loops are done."""
        if self.fatal is None:
            log.error("stopping: %s", err)
            self.fatal = err
        self.rt.stopping.set()

    def _log_stopped(self, pending: set[asyncio.Task[None]]) -> None:
        log.info(
            "stopped: %d episodes done, %d failed, %d dropped (prompt too long or refused), %d cut "
            "short; requests waited %.0f s in all for trainers to catch up",
            self.episodes,
            self.failed,
            self.dropped_prompts,
            len(pending),
            self.staleness.waited if self.staleness is not None else 0.0,
        )
        for policy, count in sorted(self.leave_out.left_out.items()):
            log.info(
                "%s: left out %d samples of groups rewarded alike, sent %d",
                policy,
                count,
                self.leave_out.sent[policy],
            )

    async def _loop(self, index: int) -> None:
        rng = random.Random(f"{self.rt.pod}/{index}/{self.rt.config.spec.workflow.task.seed}")
        while not self.rt.stopping.is_set():
            if self.staleness is not None:
                await self.staleness.refresh()  # for `catching_up`, below
            held = HeldGroups() if self.leave_out.refill else None
            episode = Episode(
                id=uuid.uuid4().hex[:16],
                spec=self.rt.config.spec,
                task=self.task,
                rng=rng,
                _generate=self._generate,
                _emit=self._emit if held is None else held.add,
                _settle=nothing_held if held is None else functools.partial(self._release, held),
                finished=frozenset(self.finished),
                warming=frozenset(self.warming),
                catching_up=self._catching_up(),
            )
            if self.gate is not None:
                await self.gate.admit()
            self.in_episode.add(index)
            try:
                await self.workflow.run(episode)
                if held is not None:
                    await self._release(held)
                self.episodes += 1
                self._record(episode)
            except PromptError as err:
                self.dropped_prompts += 1
                log.warning("episode %s dropped: %s", episode.id, err)
            except (GenerationTimeout, ValueError, KeyError, IndexError) as err:
                self.failed += 1
                log.warning("episode %s failed: %s", episode.id, err)
                await asyncio.sleep(1.0)
            except StorageFull as err:  # nothing to retry into: stop, saying why
                self._stop(err)
            finally:
                self.in_episode.discard(index)
                if self.gate is not None:
                    await self.gate.done({p: len(r) for p, r in episode.rewards.items()})

    async def _release(self, held: HeldGroups) -> None:
        """Send the samples held so far, but the groups `leave_out` leaves out (at the end of
        an episode, or where its workflow settles them: `Episode.settle`)."""
        for group in held.take():
            if self.leave_out.send(group):
                for s in group:
                    await self._emit(s.policy, s.group, s.response, s.index, s.reward)

    def _catching_up(self) -> frozenset[str]:
        """Policies asked for all the samples their trainers can take within maxStaleness."""
        if self.staleness is None:
            return frozenset()
        return frozenset(
            p.name for p in self.rt.config.spec.policies if not self.staleness.has_room(p.name)
        )

    def _record(self, episode: Episode) -> None:
        for reason in episode.dropped:
            log.warning("sample dropped: %s", reason)
        self.dropped_samples += len(episode.dropped)
        scored = sum(len(rewards) for rewards in episode.rewards.values())
        self.reward_health.record(scored=scored, dropped=episode.dropped)
        try:
            self.reward_health.check()
        except RewardsFailing as err:
            self._stop(err)
        if isinstance(self.workflow, Reports):
            self._write_metrics(self.workflow.report())
        for policy, rewards in episode.rewards.items():
            window = self.recent.setdefault(policy, [])
            window.extend(rewards)
            del window[:-512]
        means = [sum(w) / len(w) for w in self.recent.values() if w]
        self.rt.figures = {
            "requests_served": self.episodes,
            "dropped_prompts": self.dropped_prompts,
            "dropped_samples": self.dropped_samples,
            "failed_episodes": self.failed,
            "reward": sum(means) / len(means) if means else None,
        }
        elapsed = time.monotonic() - self.started
        if self.gate is not None and elapsed > 0:
            self.rt.figures["idle_fraction"] = min(1.0, self.gate.waited / elapsed)

    def _write_metrics(self, records: list[dict[str, Any]]) -> None:
        """The workflow's own figures (a verifier's judging) into the run's metrics, beside
        the trainers' lines, and the log."""
        for record in records:
            log.info("judged %s", record)
        self.metrics.write(records)

    async def _generate(
        self, policy: str, prompt: Prompt, n: int, max_new: int
    ) -> GenerationResponse:
        """Ask `policy` for `n` samples, once it may be asked (`staleness`, async mode), from
        weights no older than the round's (sync mode) or the staleness bound's (async).

        The prompt becomes ids here, with the policy's own tokenizer (`prompts`)."""
        encoder = await self.tokenizers.get(policy)
        ids = encoder.encode(prompt, max_new_tokens=max_new)
        return await self._generate_ids(policy, ids, n, max_new)

    async def _generate_ids(
        self, policy: str, prompt: list[int], n: int, max_new: int
    ) -> GenerationResponse:
        if self.staleness is None:
            oldest = self.gate.min_version(policy) if self.gate is not None else 0
            return await self._request(policy, prompt, n, max_new, min_version=oldest)
        oldest = await self.staleness.reserve(policy, n)
        try:
            return await self._request(policy, prompt, n, max_new, min_version=oldest)
        finally:
            self.staleness.answered(policy, n)

    async def _request(
        self, policy: str, prompt: list[int], n: int, max_new: int, *, min_version: int
    ) -> GenerationResponse:
        """One request, retried on timeout under a fresh id."""
        temperature = self.rt.config.spec.algorithm.temperature
        for attempt in range(self.retries):
            rid = f"{self.rt.pod}-{self.boot}-{next(self.counter)}-{attempt}"
            request = GenerationRequest(
                id=rid,
                episode_id=rid,
                policy=policy,
                prompt_tokens=prompt,
                n=n,
                max_new_tokens=max_new,
                temperature=temperature,
                min_version=min_version,
                reply_to=self.inbox,
            )
            future: asyncio.Future[GenerationResponse] = asyncio.get_running_loop().create_future()
            self.waiting[rid] = future
            try:
                await self._publish_request(policy, request)
                response = await asyncio.wait_for(future, timeout=self.request_timeout)
            except TimeoutError:
                log.info("request %s to %s timed out; retrying", rid, policy)
            else:
                if response.error is not None:
                    raise GenerationRefused(
                        f"policy {policy!r} refused a request: {response.error}"
                    )
                return response
            finally:
                self.waiting.pop(rid, None)
        raise GenerationTimeout(f"no answer from policy {policy!r} after {self.retries} tries")

    async def _publish_request(self, policy: str, request: GenerationRequest) -> None:
        try:
            await self.rt.js.publish(
                self.rt.names.requests_subject(policy),
                request.model_dump_json().encode(),
                headers={"Nats-Msg-Id": request.id},
            )
        except APIError as err:
            if not natsconfig.is_full(err):
                raise
            raise StorageFull(
                f"the request queue of policy {policy!r} is full "
                f"({natsconfig.REQUEST_CAP} requests waiting): no rollout worker takes them"
            ) from err

    async def _on_reply(self, msg: Msg) -> None:
        try:
            response = GenerationResponse.model_validate_json(msg.data)
        except ValidationError as err:
            await self.rt.dead_letter(msg.subject, msg.data, f"malformed response: {err}")
            return
        future = self.waiting.get(response.id)
        if future is not None and not future.done():
            future.set_result(response)

    async def _emit(
        self, policy: str, group: str, response: GenerationResponse, index: int, reward: float
    ) -> None:
        completion = response.completions[index]
        trajectory = Trajectory(
            id=f"{group}/{index}",
            episode_id=group.split("/", 1)[0],
            group_id=group,
            policy=policy,
            prompt_tokens=response.prompt_tokens,
            tokens=completion.tokens,
            logprobs=completion.logprobs,
            reward=reward,
            weight_version=response.weight_version,
            created_at=time.time(),
        )
        subject = self.rt.names.trajectories_subject(policy)
        body = trajectory.model_dump_json().encode()
        await outage.retry(  # stored once: the message id
            lambda: self.rt.js.publish(subject, body, headers={"Nats-Msg-Id": trajectory.id}),
            what=f"trajectory {trajectory.id}",
        )
