"""`polyrl bench dataplane`: the data plane driven hard, with a null engine and a null trainer.

What runs is the real data plane of one policy on an embedded nats-server: the real workflow
runner (single workflow, arithmetic task) asks through the real request queue; 1, 4 and 16
real rollout workers (quick: 1 and 4) answer with `NullEngine`, which returns canned tokens
at once; and `NullTrainer`, a benchmark part, takes batches off the trajectory stream with
the trainer's own `pull_batch` (parse, staleness filter) and acknowledges them without any
math. So the figures are what NATS, the wire models and the workers' loops sustain.

- `replicas_<n>`: samples/s reaching the trainer end to end, requests/s served, over a
  window after a warm-up.
- `stream`: the trajectory stream alone (Trajectory JSON published as the runner publishes
  it, consumed and parsed as the trainer does) against raw JetStream publish and consume of
  messages of the same size, in the same run: `stream_over_raw` (target >= 0.8).
- `overload`: a trainer slower than generation (it sleeps per step). The runner's bound on
  how far generation runs ahead (`staleness`) holds it back; at the end every trajectory the
  stream accepted is trained, dropped as stale (counted), or still queued for the trainer:
  `overload_unaccounted` must be 0.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StreamConfig

from polyrl.api import natsconfig
from polyrl.api.launch import Role
from polyrl.api.messages import WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.resources import ModelSource, RLJobSpec
from polyrl.api.wire import Trajectory
from polyrl.bench import simulation
from polyrl.local.natsserver import NatsServer

POLICY = "solver"
BATCH = 256
NEW_TOKENS = 16
QUICK = {"replicas": (1, 4), "warmup": 3.0, "window": 5.0, "messages": 2000}
FULL = {"replicas": (1, 4, 16), "warmup": 5.0, "window": 15.0, "messages": 10000}


def spec(replicas: int) -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": POLICY,
                    "model": {"path": "tiny-llama://bench-dataplane"},
                    "trainer": {"batchSize": BATCH},
                    "rollout": {"maxBatchSize": 64},
                }
            ],
            "workflow": {
                "name": "single",
                "episodesInFlight": 32 * replicas,
                "task": {"name": "arithmetic", "params": {"digits": 2}},
            },
            "algorithm": {"groupSize": 8, "maxNewTokens": NEW_TOKENS},
        }
    )


@dataclass
class NullTrainer:
    """A benchmark part: the trainer's intake without its math. It pulls batches with the
    trainer's `pull_batch`, optionally sleeps as if training (`delay`), and acknowledges."""

    rt: Any
    batch: int
    delay: float = 0.0
    trained: int = 0
    stale: int = 0
    steps: int = 0
    trained_ids: collections.Counter[str] = field(default_factory=collections.Counter)

    async def run(self) -> None:
        from polyrl.workers.trainer import intake as trainer

        sub = await self.rt.js.pull_subscribe(
            self.rt.names.trajectories_subject(POLICY),
            durable=JobNames.trainer_consumer,
            stream=self.rt.names.trajectories_stream(POLICY),
        )
        self.rt.state = WorkerState.TRAINING
        self.rt.figures = {"weight_version": 0, "step": 0}
        await self.rt.beat()
        while not self.rt.stopping.is_set():
            kept, msgs, dropped = await trainer.pull_batch(
                self.rt, sub, self.batch, version=0, max_staleness=4
            )
            if self.delay:
                await asyncio.sleep(self.delay)
            for msg in msgs:
                await msg.ack()
            self.trained += len(kept)
            self.trained_ids.update(t.id for t in kept)
            self.stale += len(dropped)
            self.steps += 1
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


@dataclass
class Pipeline:
    """One policy's workers on one job: the runner, `replicas` rollout workers, the trainer."""

    url: str
    names: JobNames
    spec: RLJobSpec
    runtimes: list[Any] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    rollouts: list[Any] = field(default_factory=list)
    runner: Any = None
    runner_task: asyncio.Task[Any] | None = None
    trainer: NullTrainer | None = None
    trainer_task: asyncio.Task[Any] | None = None

    async def connect(self, role: Role, pod: str) -> Any:
        policy = None if role == Role.WORKFLOW else POLICY
        rt = await simulation.connect_worker(self.url, self.names, self.spec, role, pod, policy)
        self.runtimes.append(rt)
        return rt

    async def start(self, bundle_dir: Path, replicas: int, delay: float) -> None:
        from transformers import AutoTokenizer

        from polyrl.workers.rollout.engines.null_engine import NullEngine
        from polyrl.workers.rollout.worker import ModelFacts, RolloutWorker

        await publish_policy(self.url, self.names, bundle_dir)
        tokenizer = AutoTokenizer.from_pretrained(bundle_dir, local_files_only=True)
        self.trainer = NullTrainer(await self.connect(Role.TRAINER, "trainer-0"), BATCH, delay)
        self.trainer_task = asyncio.create_task(self.trainer.run())
        self.tasks.append(self.trainer_task)
        for i in range(replicas):
            rt = await self.connect(Role.ROLLOUT, f"rollout-{i}")
            worker = RolloutWorker(rt, NullEngine(), tokenizer, model=ModelFacts.of(tokenizer))
            self.rollouts.append(worker)
            self.tasks.append(asyncio.create_task(worker.run()))
        await self._start_runner()

    async def _start_runner(self) -> None:
        from polyrl.workers.runner import main as runner_main

        self.runner = runner_main.build_workflow(await self.connect(Role.WORKFLOW, "workflow-0"))
        self.runner_task = asyncio.create_task(self.runner.run())
        self.tasks.append(self.runner_task)

    def counts(self) -> tuple[int, int]:
        assert self.trainer is not None
        return self.trainer.trained, sum(w.served for w in self.rollouts)

    async def stop_generating(self) -> None:
        """The runner first, while rollouts still answer its episodes in flight (stopped
        together, those would wait out the runner's drain timeout), then the rollouts."""
        self.runner.rt.stopping.set()
        assert self.runner_task is not None
        await asyncio.wait_for(asyncio.gather(self.runner_task, return_exceptions=True), 60)
        for worker in self.rollouts:
            worker.rt.stopping.set()

    async def stop(self) -> None:
        await self.stop_generating()
        for rt in self.runtimes:
            rt.stopping.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), timeout=60)
        await asyncio.gather(*(rt.close() for rt in self.runtimes))


async def publish_policy(url: str, names: JobNames, bundle_dir: Path) -> None:
    """What a trainer publishes before RL: the model bundle (the runner's tokenizer) and a
    first weight announcement (the null engine ignores the weights; the runner waits for it)."""
    import torch

    from polyrl.workers.weightsync import bundle
    from polyrl.workers.weightsync.publish import WeightPublisher
    from polyrl.workers.weightsync.store import WeightStore

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await natsconfig.ensure(js, names, [POLICY])
        await bundle.publish(js, names, POLICY, bundle_dir)
        store = await WeightStore.open(js, names.weights_bucket(POLICY))
        publisher = WeightPublisher(store, names, POLICY, keyframe_every=1)
        await publisher.publish({"w": torch.zeros(4, dtype=torch.bfloat16)})
        await store.close()
    finally:
        await nc.close()


async def pipeline(
    url: str, bundle_dir: Path, replicas: int, *, warmup: float, window: float, delay: float = 0.0
) -> dict[str, Any]:
    """Samples/s and requests/s through the whole data plane over `window` seconds."""
    names = JobNames(namespace="bench", job=f"dp{replicas}-{uuid.uuid4().hex[:6]}")
    run = Pipeline(url, names, spec(replicas))
    await run.start(bundle_dir, replicas, delay)
    try:
        await asyncio.sleep(warmup)
        (samples0, served0), started = run.counts(), time.monotonic()
        await asyncio.sleep(window)
        (samples1, served1), seconds = run.counts(), time.monotonic() - started
        figures = {
            "replicas": replicas,
            "samples_per_s": round((samples1 - samples0) / seconds, 1),
            "requests_per_s": round((served1 - served0) / seconds, 1),
            "episodes_failed": run.runner.failed,
            "dead_letters": sum(rt.dead_letters for rt in run.runtimes),
        }
        if delay:
            figures |= await ledger(run)
        return figures
    finally:
        await run.stop()
        await remove(url, names)


async def ledger(run: Pipeline) -> dict[str, Any]:
    """Stop generating, let the trainer take everything, and account for every trajectory by
    the stream's own ids: each trained once, or dropped as stale (counted)."""
    assert run.trainer is not None
    await run.stop_generating()
    js = run.trainer.rt.js
    stream = run.names.trajectories_stream(POLICY)
    for _ in range(60):  # until the trainer has been handed everything
        info = await js.consumer_info(stream, JobNames.trainer_consumer)
        if not info.num_pending:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(run.trainer.delay + 1.0)  # its last batch
    run.trainer.rt.stopping.set()  # it acknowledges what it holds, short batch or not
    assert run.trainer_task is not None
    await asyncio.wait_for(asyncio.gather(run.trainer_task, return_exceptions=True), 30)
    published = await stream_ids(js, run.names.trajectories_subject(POLICY))
    trained = run.trainer.trained_ids
    return {
        "trainer_delay_s": run.trainer.delay,
        "published": len(published),
        "trained": run.trainer.trained,
        "dropped_stale": run.trainer.stale,
        "trained_twice": sum(1 for n in trained.values() if n > 1),
        "never_published": len(set(trained) - set(published)),
        "overload_unaccounted": len(set(published) - set(trained)) - run.trainer.stale,
    }


async def stream_ids(js: Any, subject: str) -> list[str]:
    """The id of every trajectory the stream holds, read from the start."""
    sub = await js.subscribe(subject, ordered_consumer=True)
    ids: list[str] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2)
            except nats.errors.TimeoutError:
                return ids
            ids.append(Trajectory.model_validate_json(msg.data).id)
    finally:
        await sub.unsubscribe()


async def remove(url: str, names: JobNames) -> None:
    nc = await nats.connect(url)
    try:
        await natsconfig.remove(nc.jetstream(), names, [POLICY])
    finally:
        await nc.close()


async def stream_vs_raw(url: str, count: int, rounds: int = 5) -> dict[str, Any]:
    """The trajectory stream (as the runner publishes and the trainer parses) against raw
    JetStream publish and consume of messages of the same size. The two alternate over
    `rounds` rounds of `count / rounds` messages each, and the medians are compared: one
    measurement of each, one after the other, varied by a third on this machine."""
    trajectory = Trajectory(
        id="e/0", episode_id="e", group_id="e/g", policy=POLICY, prompt_tokens=list(range(12)),
        tokens=[1] * NEW_TOKENS, logprobs=[-0.5] * NEW_TOKENS, reward=1.0, weight_version=0,
        created_at=time.time(),
    )  # fmt: skip
    size = len(trajectory.model_dump_json())
    each = max(1, count // rounds)

    def encode(i: int) -> bytes:
        return trajectory.model_copy(update={"id": f"e{i}/0"}).model_dump_json().encode()

    raw: list[float] = []
    parsed: list[float] = []
    windowed: list[float] = []
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for _ in range(rounds):
            name = f"bench-raw-{uuid.uuid4().hex[:6]}"
            await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.x"]))
            raw.append(await _through(js, name, f"{name}.x", each, lambda i: b"x" * size))
            await js.delete_stream(name)
            names = JobNames(namespace="bench", job=f"stream-{uuid.uuid4().hex[:6]}")
            await natsconfig.ensure(js, names, [POLICY])
            stream, subject = names.trajectories_stream(POLICY), names.trajectories_subject(POLICY)
            parse = Trajectory.model_validate_json
            parsed.append(await _through(js, stream, subject, each, encode, parse=parse))
            await natsconfig.remove(js, names, [POLICY])
            await natsconfig.ensure(js, names, [POLICY])  # as the runner sends: a window
            windowed.append(
                await _through(js, stream, subject, each, encode, parse=parse, window=True)
            )
            await natsconfig.remove(js, names, [POLICY])
    finally:
        await nc.close()
    raw_median, parsed_median = statistics.median(raw), statistics.median(parsed)
    windowed_median = statistics.median(windowed)
    return {
        "message_bytes": size,
        "messages": each * rounds,
        "rounds": rounds,
        "raw_msgs_per_s": raw_median,
        "trajectory_msgs_per_s": parsed_median,
        "trajectory_windowed_msgs_per_s": windowed_median,
        "raw_range": [min(raw), max(raw)],
        "trajectory_range": [min(parsed), max(parsed)],
        "stream_over_raw": round(parsed_median / raw_median, 3),
        "windowed_over_awaited": round(windowed_median / parsed_median, 3),
    }


async def _through(
    js: Any,
    stream: str,
    subject: str,
    count: int,
    make: Any,
    parse: Any = None,
    *,
    window: bool = False,
) -> float:
    """Messages/s for publishing `count` messages, each with a de-duplication id, and then
    consuming them in batches, acking each. Published awaiting each ack in turn, or (`window`)
    as the workflow runner sends trajectories: acks awaited in a `PublishWindow`."""
    from polyrl.workers.runtime.window import PublishWindow

    started = time.perf_counter()
    sending = PublishWindow()
    for i in range(count):
        body, headers = make(i), {"Nats-Msg-Id": f"m{i}"}
        if window:
            await sending.submit(functools.partial(js.publish, subject, body, headers=headers))
        else:
            await js.publish(subject, body, headers=headers)
    await sending.flush()
    sub = await js.pull_subscribe(subject, durable="bench", stream=stream)
    got = 0
    while got < count:
        for msg in await sub.fetch(min(256, count - got), timeout=5):
            if parse is not None:
                parse(msg.data)
            await msg.ack()
            got += 1
    return round(count / (time.perf_counter() - started), 1)


async def _measure(url: str, tmp: Path, quick: bool) -> dict[str, Any]:
    from polyrl.workers.models import loading as models

    plan: dict[str, Any] = QUICK if quick else FULL
    model, tokenizer = models.make_model(
        ModelSource(path="tiny-llama://bench-dataplane", dtype="float32"), cache_dir=tmp / "m"
    )
    models.export(model, tokenizer, tmp / "bundle")
    figures: dict[str, Any] = {"quick": quick, "batch": BATCH, "new_tokens": NEW_TOKENS}
    # First, on the fresh server: after the pipelines its rates are lower and noisier.
    figures["stream"] = await stream_vs_raw(url, plan["messages"])
    for n in plan["replicas"]:
        figures[f"replicas_{n}"] = await pipeline(
            url, tmp / "bundle", n, warmup=plan["warmup"], window=plan["window"]
        )
    rates = [figures[f"replicas_{n}"]["samples_per_s"] for n in plan["replicas"]]
    figures["scaling_last_over_first"] = round(rates[-1] / rates[0], 2) if rates[0] else None
    figures["overload"] = await pipeline(
        url, tmp / "bundle", 4, warmup=plan["warmup"], window=plan["window"], delay=0.5
    )
    figures["median_samples_per_s"] = statistics.median(rates)
    return figures


def run(*, quick: bool) -> dict[str, Any]:
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="polyrl-bench-dataplane-") as tmp,
        NatsServer(Path(tmp) / "nats") as server,
    ):
        figures = asyncio.run(_measure(server.url, Path(tmp), quick))
    figures["total_s"] = round(time.monotonic() - started, 1)
    return figures
