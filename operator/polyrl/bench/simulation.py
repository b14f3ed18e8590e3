"""Simulated jobs: the real data plane and workers with modelled generation and training.

What runs, on an embedded nats-server: the real workflow runner(s) (`workflow.replicas`; in
this process, or each in a process of its own with `Setup.runner_processes`, as in a pod),
the real rollout workers (`RolloutWorker`, each with its own NATS connection, as pods have)
over `SimulatedEngine` and `AnnouncedVersions`, and one `SimulatedTrainer` per policy (the
trainer's NATS side and intake, its step modelled), the replicas and trainers in this process.
The latency model and the trainer's cost are `polyrl.workers.runtime.simulation`'s; modelled
time runs `compression` times faster than wall time. Nothing imports torch: the bundle the
runner reads its tokenizer from is the character tokenizer's files, written with `tokenizers`
alone.

Several policies are served by the entry-point workflow `rotating` below: each episode asks
the next policy in turn for one group, as `single` does for one policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from polyrl.api import natsconfig
from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.naming import JobNames
from polyrl.api.resources import RLJobSpec
from polyrl.local.natsserver import NatsServer
from polyrl.workers.runtime.simulation import LatencyModel, TrainCost
from polyrl.workers.tasks.rewards import RewardFailed
from polyrl.workers.workflows.episode import Episode

_turns = itertools.count()


async def rotating(episode: Episode) -> None:
    """Episode k asks policy k mod P for one group of the task's problem, rewarded as in
    `single` (a benchmark workflow: several policies, one group per episode)."""
    policies = [p.name for p in episode.spec.policies]
    policy = policies[next(_turns) % len(policies)]
    problem = episode.task.sample(episode.rng)
    response = await episode.generate(policy, problem.request, episode.group_size)
    for i in range(len(response.completions)):
        try:
            reward = episode.task.reward(problem, episode.text(response, i))
        except RewardFailed as err:
            episode.drop(str(err))
            continue
        await episode.emit(policy, "answer", response, i, reward)


@dataclass(frozen=True)
class Setup:
    """One simulated job: its shape, its modelled compute and how fast modelled time runs."""

    model: LatencyModel
    cost: TrainCost
    compression: float
    policies: tuple[str, ...] = ("solver",)
    replicas: int = 4
    """Rollout replicas per policy."""
    batch: int = 128
    group: int = 8
    requests_per_call: int = 4
    """`rollout.maxBatchSize`: requests a replica fetches and generates together."""
    new_tokens: int = 4096
    mode: str = "async"
    runners: int = 1
    episodes_in_flight: int = 64
    speeds: tuple[float, ...] = ()
    """One factor per replica of a policy (mixed hardware); empty: all 1."""
    sync_seconds: float = 0.0
    """Modelled seconds a replica takes to take up a new version."""
    max_staleness: int = 4
    """`algorithm.maxStaleness`: with the batch, how far generation may run ahead."""
    publish_window: int | None = None
    """Trajectories the runner publishes before awaiting acknowledgements; None: its own."""
    runner_processes: bool = False
    """Each workflow runner in a process of its own (`runner_process`), as in a pod; else
    on this process's event loop with everything else."""

    def speed(self, replica: int) -> float:
        return self.speeds[replica % len(self.speeds)] if self.speeds else 1.0


def job_spec(setup: Setup) -> RLJobSpec:
    workflow = "single" if len(setup.policies) == 1 else "polyrl.bench.simulation:rotating"
    return RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": name,
                    "model": {"path": "tiny-llama://bench-simulated"},
                    "trainer": {"batchSize": setup.batch},
                    "rollout": {"maxBatchSize": setup.requests_per_call},
                }
                for name in setup.policies
            ],
            "workflow": {
                "name": workflow,
                "replicas": setup.runners,
                "episodesInFlight": setup.episodes_in_flight,
                "task": {"name": "arithmetic", "params": {"digits": 2}},
            },
            "algorithm": {
                "mode": setup.mode,
                "groupSize": setup.group,
                "maxNewTokens": setup.new_tokens,
                "maxStaleness": setup.max_staleness,
            },
        }
    )


def write_bundle(directory: Path) -> Path:
    """A model bundle as the runner reads it (tokenizer and config), without a model."""
    from polyrl.workers.models import chartokenizer

    directory.mkdir(parents=True, exist_ok=True)
    chartokenizer.backend().save(str(directory / "tokenizer.json"))
    specials = dict(zip(("pad_token", "bos_token", "eos_token", "unk_token"),
                        chartokenizer.SPECIAL_TOKENS, strict=True))  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(specials))
    vocab = len(chartokenizer.vocabulary())
    (directory / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    return directory


async def connect_worker(
    url: str, names: JobNames, spec: RLJobSpec, role: Role, pod: str, policy: str | None
) -> Any:
    """A worker's `Runtime` on the job, as its pod would connect (the benchmarks' workers)."""
    from polyrl.workers.runtime.worker import Runtime

    config = WorkerConfig(namespace=names.namespace, job=names.job, role=role, policy=policy,
                          nats_url=url, spec=spec)  # fmt: skip
    return await Runtime.connect(config, pod)


def build_runner(rt: Any, publish_window: int | None) -> Any:
    """The job's workflow runner on `rt`; `publish_window` replaces its own publish window's
    size (1: each trajectory's acknowledgement awaited before the next, as before it)."""
    from polyrl.workers.runner import main as runner_main
    from polyrl.workers.runtime.window import PublishWindow

    runner = runner_main.build_workflow(rt)
    if publish_window:
        before = runner.emission.window
        runner.emission.window = PublishWindow(publish_window, on_error=before.on_error)
    return runner


Measure = Callable[[str, int | None, Path], Coroutine[Any, Any, dict[str, Any]]]
"""A benchmark's measurements, given the server's URL, its PID and the bundle's directory."""


def run_on_server(name: str, measure: Measure) -> dict[str, Any]:
    """`measure` on a fresh embedded nats-server with the bundle written, both removed after;
    its figures with the run's `total_s`."""
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix=f"polyrl-bench-{name}-") as tmp,
        NatsServer(Path(tmp) / "nats") as server,
    ):
        bundle = write_bundle(Path(tmp) / "bundle")
        pid = server.proc.pid if server.proc is not None else None
        figures = asyncio.run(measure(server.url, pid, bundle))
    figures["total_s"] = round(time.monotonic() - started, 1)
    return figures


class CharTokenizer:
    """What a rollout worker needs of a tokenizer (`worker.Tokenizer`), from the bundle."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        from polyrl.workers.models import chartokenizer

        self.backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.eos_token_id = chartokenizer.EOS_ID
        self.special = set(range(len(chartokenizer.SPECIAL_TOKENS)))

    def __len__(self) -> int:
        return int(self.backend.get_vocab_size())

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        kept = [i for i in ids if not (skip_special_tokens and i in self.special)]
        return str(self.backend.decode(kept))


@dataclass
class SimulatedJob:
    """One simulated job's workers, started and stopped together."""

    url: str
    setup: Setup
    names: JobNames = field(
        default_factory=lambda: JobNames(namespace="bench", job=f"sim-{uuid.uuid4().hex[:6]}")
    )
    runtimes: list[Any] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    trainers: list[Any] = field(default_factory=list)
    trainer_tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    rollouts: dict[str, list[Any]] = field(default_factory=dict)
    runners: list[Any] = field(default_factory=list)
    runner_tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    runner_procs: list[subprocess.Popen[str]] = field(default_factory=list)
    failed_in_processes: int = 0

    @functools.cached_property
    def spec(self) -> RLJobSpec:
        return job_spec(self.setup)

    async def connect(self, role: Role, pod: str, policy: str | None) -> Any:
        rt = await connect_worker(self.url, self.names, self.spec, role, pod, policy)
        self.runtimes.append(rt)
        return rt

    async def start(self, bundle_dir: Path, *, steps: int | None) -> None:
        from polyrl.workers.trainer.simulated import SimulatedTrainer

        for name in self.setup.policies:
            rt = await self.connect(Role.TRAINER, f"{name}-trainer-0", name)
            trainer = SimulatedTrainer(rt, cost=self.setup.cost, steps=steps,
                compression=self.setup.compression, bundle_dir=bundle_dir)  # fmt: skip
            self.trainers.append(trainer)
            self.trainer_tasks.append(asyncio.create_task(trainer.run()))
            self.rollouts[name] = [await self._rollout(name, i, bundle_dir)
                                   for i in range(self.setup.replicas)]  # fmt: skip
        self.tasks += self.trainer_tasks
        for i in range(self.setup.runners):
            if self.setup.runner_processes:
                self._spawn_runner(i, bundle_dir)
            else:
                await self._start_runner(i)

    async def _rollout(self, policy: str, index: int, bundle_dir: Path) -> Any:
        from polyrl.workers.rollout.announced import AnnouncedVersions
        from polyrl.workers.rollout.engines.simulated_engine import SimulatedEngine
        from polyrl.workers.rollout.worker import ModelFacts, RolloutWorker

        rt = await self.connect(Role.ROLLOUT, f"{policy}-rollout-{index}", policy)
        engine = SimulatedEngine(self.setup.model, speed=self.setup.speed(index),
            compression=self.setup.compression, seed=hash((policy, index)) % 2**31)  # fmt: skip
        weights = AnnouncedVersions(rt.js, self.names, policy, sync_seconds=self.setup.sync_seconds,
            compression=self.setup.compression)  # fmt: skip
        tokenizer = CharTokenizer(bundle_dir)
        worker = RolloutWorker(rt, engine, tokenizer, weights, model=ModelFacts.of(tokenizer))
        self.tasks.append(asyncio.create_task(worker.run()))
        return worker

    def _spawn_runner(self, index: int, bundle_dir: Path) -> None:
        spec_file = bundle_dir.parent / f"{self.names.job}.json"
        spec_file.write_text(self.spec.model_dump_json(by_alias=True, exclude_none=True))
        argv = [
            sys.executable, "-m", "polyrl.bench.runner_process", "--url", self.url,
            "--namespace", self.names.namespace, "--job", self.names.job,
            "--pod", f"workflow-{index}", "--spec", str(spec_file),
            "--publish-window", str(self.setup.publish_window or 0),
        ]  # fmt: skip
        self.runner_procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))

    async def _start_runner(self, index: int) -> None:
        rt = await self.connect(Role.WORKFLOW, f"workflow-{index}", None)
        runner = build_runner(rt, self.setup.publish_window)
        self.runners.append(runner)
        self.runner_tasks.append(asyncio.create_task(runner.run()))
        self.tasks += self.runner_tasks[-1:]

    def trained(self) -> int:
        return sum(len(t.trained_ids) for t in self.trainers)

    async def stored(self) -> int:
        """Trajectories the policies' streams took so far (each goes to its trainer)."""
        js = self.runtimes[0].js
        infos = [
            await js.stream_info(self.names.trajectories_stream(p)) for p in self.setup.policies
        ]
        return sum(info.state.messages for info in infos)

    def engines(self) -> list[Any]:
        return [w.engine for workers in self.rollouts.values() for w in workers]

    async def finished(self, timeout: float) -> None:
        """Until every trainer reached its last step (TimeoutError after `timeout`)."""
        await asyncio.wait_for(asyncio.gather(*self.trainer_tasks), timeout)

    @property
    def failed(self) -> int:
        """Episodes that failed, over every runner."""
        return int(sum(r.failed for r in self.runners)) + self.failed_in_processes

    async def stop(self) -> None:
        """The runners first, while rollouts still answer what they wait for, then the rest."""
        for runner in self.runners:
            runner.rt.stopping.set()
        for proc in self.runner_procs:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*self.runner_tasks, return_exceptions=True), 60)
        for proc in self.runner_procs:
            try:
                out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"workflow runner {proc.pid} did not stop in 60 s") from None
            if proc.returncode != 0:
                raise RuntimeError(f"workflow runner {proc.pid} exited with {proc.returncode}")
            self.failed_in_processes += int(json.loads(out.strip().splitlines()[-1])["failed"])
        for rt in self.runtimes:
            rt.stopping.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 60)
        await asyncio.gather(*(rt.close() for rt in self.runtimes))
        with contextlib.suppress(Exception):
            nc = await nats.connect(self.url)
            try:
                await natsconfig.remove(nc.jetstream(), self.names, list(self.setup.policies))
            finally:
                await nc.close()
