"""The workflow runner: runs episodes, `episodesInFlight` at a time, and feeds the trainers.

Each of its concurrent loops runs one episode after another through the job's workflow. The
runner itself is that loop and its end; each thing an episode needs is a part of its own: the
generation client (`generation`: requests out, replies in), what is known of the trainers
(`trainers`), when an episode or request may go (`admission`), and the trajectories sent and
counted (`emission`). On SIGTERM no new episode starts; those in flight get `drain_timeout` to
finish (less once nothing has come back for `drain_quiet`: the rollouts are going too), and
whatever they had not emitted is simply not sent, so no half-written episode reaches a
trainer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from typing import Any

from polyrl.api.messages import WorkerState
from polyrl.api.resources import Mode
from polyrl.api.wire import GenerationResponse
from polyrl.workers.errors import Unavailable
from polyrl.workers.models.prompts import Prompt, PromptError
from polyrl.workers.runner import admission, emission, generation, trainers, uniform_groups
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.workflows.dropped import EpisodeDropped
from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.interface import Reports, Workflow

log = logging.getLogger("polyrl.workflow")


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
        drain_quiet: float = 5.0,
    ) -> None:
        self.rt = rt
        self.workflow = workflow
        self.task = task
        self.concurrency = concurrency
        self.drain_timeout = drain_timeout
        self.drain_quiet = drain_quiet
        self.fatal: Exception | None = None  # why the runner stopped by itself
        self.in_episode: set[int] = set()  # loops running an episode right now
        async_mode = rt.config.spec.algorithm.mode != Mode.SYNC
        self.generation = generation.GenerationClient(
            rt, request_timeout=request_timeout, retries=retries
        )
        self.trainers = trainers.TrainerWatch(rt, async_mode=async_mode)
        self.admission = admission.Admission(rt.config.spec, self.trainers)
        self.emission = emission.Emission(rt, on_error=self._stop)
        self.accounts = emission.Accounts(rt, self.admission.gate, self._stop)

    @property
    def episodes(self) -> int:
        return self.accounts.episodes

    @property
    def failed(self) -> int:
        return self.accounts.failed

    @property
    def dropped_prompts(self) -> int:
        return self.accounts.dropped_prompts

    @property
    def dropped_samples(self) -> int:
        return self.accounts.dropped_samples

    async def run(self) -> None:
        await self.generation.listen()
        await self.rt.enter(WorkerState.SERVING)
        watchers = await self.trainers.start(versions=self.admission.staleness is not None)
        loops = [asyncio.create_task(self._loop(i)) for i in range(self.concurrency)]
        await self.rt.stopping.wait()
        for watcher in watchers:
            watcher.cancel()
        self.rt.state = WorkerState.DRAINING
        for index, task in enumerate(loops):  # not in an episode (sync mode's gate): stop now
            if index not in self.in_episode:
                task.cancel()
        pending = await self._drain(loops)
        for task in pending:
            task.cancel()
        try:
            await self.emission.flush()  # what the episodes emitted: all of it stored
        except Exception as err:  # raised below, as the runner's failure
            self._stop(err)
        if isinstance(self.workflow, Reports):
            self.accounts.write_metrics(self.workflow.flush())
        self.accounts.log_stopped(len(pending), self.admission.waited)
        self.emission.log_left_out()
        if self.fatal is not None:
            raise self.fatal

    async def _drain(self, loops: list[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
        """Wait for the episodes in flight: at most `drain_timeout`, and only `drain_quiet`
        once neither a generation reply nor an episode's end has come for that long. When
        the whole job stops (a Kueue eviction, a suspension) its rollouts and trainers stop
        too: no reply comes, and an episode held for its trainer to catch up is never let
        go. Waiting longer would only hold the pod, and its quota. Returns the loops still
        on."""
        clock = asyncio.get_running_loop().time
        deadline = clock() + self.drain_timeout
        pending = set(loops)

        def progress() -> tuple[int, int]:
            return self.generation.replies, self.accounts.episodes

        seen, heard = progress(), clock()
        while pending and (left := deadline - clock()) > 0:
            _, pending = await asyncio.wait(pending, timeout=min(left, 0.5))
            if progress() != seen:
                seen, heard = progress(), clock()
            elif clock() - heard >= self.drain_quiet:
                log.info("nothing came back for %.0fs: not waiting longer", self.drain_quiet)
                break
        return pending

    def _stop(self, err: Exception) -> None:
        """Stop the runner: `run` raises `err` (the first such) once the loops are done."""
        if self.fatal is None:
            log.error("stopping: %s", err)
            self.fatal = err
        self.rt.stopping.set()

    async def _loop(self, index: int) -> None:
        rng = random.Random(f"{self.rt.pod}/{index}/{self.rt.config.spec.workflow.task.seed}")
        while not self.rt.stopping.is_set():
            await self.admission.refresh()  # for `catching_up`, below
            held = self.emission.hold()
            episode = self._episode(rng, held)
            await self.admission.admit()
            self.in_episode.add(index)
            try:
                await self.workflow.run(episode)
                if held is not None:
                    await self.emission.release(held)
                self.accounts.episode_done(episode, self.workflow)
            except (PromptError, EpisodeDropped) as err:
                if not self.rt.stopping.is_set():  # else cut short (a tool killed on the way out)
                    self.accounts.prompt_dropped(episode, err)
            except (ValueError, KeyError, IndexError) as err:  # the workflow's own fault
                self.accounts.episode_failed(episode, err)
                await asyncio.sleep(1.0)
            # Nothing to retry into (a full stream, or NATS gone past outage.retry's
            # patience, a lost trajectory among them): stop, saying why.
            except Unavailable as err:
                self._stop(err)
            finally:
                self.in_episode.discard(index)
                await self.admission.done(episode)

    def _episode(self, rng: random.Random, held: uniform_groups.HeldGroups | None) -> Episode:
        emit, settle = self.emission.verbs(held)
        return Episode(
            id=uuid.uuid4().hex[:16],
            spec=self.rt.config.spec,
            task=self.task,
            rng=rng,
            _generate=self._generate,
            _emit=emit,
            _settle=settle,
            _prompts=self.generation.tokenizers.get,
            finished=frozenset(self.trainers.finished),
            warming=frozenset(self.trainers.warming),
            catching_up=self.admission.catching_up(),
        )

    async def _generate(
        self, policy: str, prompt: Prompt, n: int, max_new: int, *, temperature: float | None = None
    ) -> GenerationResponse:
        """Ask `policy` for `n` samples, once it may be asked (`staleness`, async mode), from
        weights no older than the round's (sync mode) or the staleness bound's (async).

        The prompt becomes ids here, with the policy's own tokenizer (`prompts`); it is sent
        once the policy has weights out (`trainers.announced`)."""
        await self.trainers.announced(policy)
        ids = await self.generation.encode(policy, prompt, max_new)
        async with self.admission.asking(policy, n) as oldest:
            return await self.generation.request(
                policy, ids, n, max_new, min_version=oldest, temperature=temperature
            )
