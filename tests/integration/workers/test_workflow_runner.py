"""Episodes end to end without a trainer: workflow runner -> rollout worker -> trajectories.

A real rollout worker (torch engine, tiny model, weights from NATS) serves a real workflow
runner; the test reads what the trainers would get from the trajectory streams.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
import torch
from nats.aio.client import Client as NatsClient

from polyrl.api import natsconfig
from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.messages import Heartbeat
from polyrl.api.naming import JobNames
from polyrl.api.resources import ModelSource, RLJobSpec, UniformGroups
from polyrl.api.wire import Completion, GenerationResponse, Trajectory
from polyrl.local.natsserver import NatsServer
from polyrl.testing.waiting import wait_until_async
from polyrl.workers.errors import StorageFull, Unavailable
from polyrl.workers.models import loading as models
from polyrl.workers.rollout import main as rollout_main
from polyrl.workers.runner import main as runner_main
from polyrl.workers.runner.reward_health import RewardsFailing
from polyrl.workers.runner.runner import WorkflowRunner
from polyrl.workers.runtime import outage
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.tasks import load_task
from polyrl.workers.tasks.rewards import RewardFailed
from polyrl.workers.weightsync import bundle
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.store import WeightStore
from polyrl.workers.workflows import Episode
from polyrl.workers.workflows.interface import FunctionWorkflow

pytestmark = pytest.mark.slow


def spec(workflow: str, mode: str = "async") -> RLJobSpec:
    names = ("solver", "verifier") if workflow == "solver-verifier" else ("solver",)
    policies = [
        {"name": name, "model": {"path": "tiny-llama://wf-test"}, "rollout": {"maxBatchSize": 16}}
        for name in names
    ]
    return RLJobSpec.model_validate(
        {
            "policies": policies,
            "workflow": {
                "name": workflow,
                "episodesInFlight": 2,
                "task": {"name": "arithmetic", "params": {"digits": 1}},
            },
            "algorithm": {"groupSize": 4, "maxNewTokens": 3, "mode": mode},
        }
    )


async def publish_policy(
    js: object, names: JobNames, policy: str, tmp: Path, *, final: bool = False, epoch: int = 0
) -> None:
    model, tokenizer = models.make_model(
        ModelSource(path="tiny-llama://wf-test", dtype="float32"), cache_dir=tmp / "m"
    )
    models.export(model, tokenizer, tmp / f"export-{policy}")
    await bundle.publish(js, names, policy, tmp / f"export-{policy}")  # type: ignore[arg-type]
    store = await WeightStore.open(js, names.weights_bucket(policy))  # type: ignore[arg-type]
    state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    publisher = WeightPublisher(store, names, policy, keyframe_every=4, epoch=epoch)
    await publisher.publish(state, final=final)
    await store.close()


async def start_workers(
    url: str,
    js: object,
    names: JobNames,
    job: RLJobSpec,
    tmp_path: Path,
    *,
    unserved: tuple[str, ...] = (),
) -> tuple[list[Runtime], list[asyncio.Task[Any]], WorkflowRunner]:
    """A rollout worker per policy (its weights published first) but those `unserved` (their
    weights published, no worker), and a running workflow runner."""
    runtimes, tasks = [], []
    for policy in (p.name for p in job.policies):
        await publish_policy(js, names, policy, tmp_path)
        if policy in unserved:
            continue
        config = WorkerConfig(
            namespace="t", job=names.job, role=Role.ROLLOUT, policy=policy, nats_url=url, spec=job
        )
        rt = await Runtime.connect(config, f"{policy}-rollout-0")
        runtimes.append(rt)
        tasks.append(
            asyncio.create_task((await rollout_main.build_rollout(rt, bundle_timeout=30)).run())
        )
    config = WorkerConfig(namespace="t", job=names.job, role=Role.WORKFLOW, nats_url=url, spec=job)
    rt = await Runtime.connect(config, "workflow-0")
    runtimes.append(rt)
    runner = runner_main.build_workflow(rt)
    tasks.append(asyncio.create_task(runner.run()))
    return runtimes, tasks, runner


async def stop_workers(runtimes: list[Runtime], tasks: list[asyncio.Task[Any]]) -> None:
    for r in runtimes:
        r.stopping.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=60)
    for r in runtimes:
        await r.close()


async def stopped_by_itself(runner: asyncio.Task[Any], going_on: str) -> BaseException | None:
    """The runner's failure once it stopped by itself, which it must within a minute."""
    done, _ = await asyncio.wait([runner], timeout=60)
    assert done, f"the runner went on {going_on}"
    return runner.exception()


async def collect(nc: NatsClient, names: JobNames, policy: str, count: int) -> list[Trajectory]:
    sub = await nc.jetstream().subscribe(names.trajectories_subject(policy))
    got = [
        Trajectory.model_validate_json((await sub.next_msg(timeout=120)).data) for _ in range(count)
    ]
    await sub.unsubscribe()
    return got


@pytest.mark.parametrize("workflow", ["single", "solver-verifier"])
async def test_episodes_become_rewarded_trajectories_for_each_policy(
    nats_server: NatsServer, tmp_path: Path, workflow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("POLYRL_METRICS_FILE", str(metrics))
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec(workflow)
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver", "verifier"])
    runtimes, tasks, runner = await start_workers(
        nats_server.url, nc.jetstream(), names, job, tmp_path
    )
    try:
        solver = await collect(nc, names, "solver", 8)
        assert {t.policy for t in solver} == {"solver"}
        assert all(t.reward in (0.0, 1.0) for t in solver)
        assert all(len(t.logprobs) == len(t.tokens) > 0 for t in solver)
        groups = {t.group_id for t in solver}
        assert all(sum(t.group_id == g for t in solver) == 4 for g in groups)  # whole groups
        assert len({t.id for t in solver}) == 8
        if workflow == "solver-verifier":
            verifier = await collect(nc, names, "verifier", 4)
            assert all(t.group_id.split("/", 1)[1].startswith("verdict-") for t in verifier)
            # The verifier has an answer's room (3) for its working, then one for the verdict;
            # an untrained model rarely stops early, so some verdict uses all of it.
            assert max(len(t.tokens) for t in verifier) == 4
        # An episode counts only once its workflow returns: after its last emit and, for
        # solver-verifier, after its verifier answers, which rollout workers that were already
        # told to stop may never send. Wait for the count while everything still runs.
        await wait_until_async("2 episodes done", lambda: runner.episodes >= 2, timeout=60)
    finally:
        await stop_workers(runtimes, tasks)
        await nc.close()
    assert runner.workflow.name == workflow  # the runner ran the workflow the job names
    # How well the verifier judged, per window of its versions, flushed when the runner stopped:
    # two answers of every finished episode, each judged a group of times.
    judged = (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    if workflow == "single":
        assert judged == []
    else:
        assert {(r["policy"], r["source"], tuple(r["versions"])) for r in judged} == {
            ("verifier", "workflow", (0, 9))
        }
        group = job.algorithm.group_size
        assert sum(r["judged"] for r in judged) == 2 * group * runner.episodes


async def test_the_runner_tracks_which_trainers_still_warm_up_and_which_are_done(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver", "verifier"])
    await publish_policy(nc.jetstream(), names, "solver", tmp_path)
    config = WorkerConfig(
        namespace="t",
        job=names.job,
        role=Role.WORKFLOW,
        nats_url=nats_server.url,
        spec=spec("solver-verifier"),
    )
    rt = await Runtime.connect(config, "workflow-0")
    watch = runner_main.build_workflow(rt).trainers
    watcher = asyncio.create_task(watch.watch())
    try:
        assert watch.warming == {"solver", "verifier"}  # nothing polled yet
        await watch.poll()
        # The verifier's trainer has announced nothing: it is still warming up.
        assert (watch.warming, watch.finished) == ({"verifier"}, set())
        # A request for it waits for its weights (no timeout, no retry, nothing dropped);
        # one for the solver goes at once.
        held = asyncio.create_task(watch.announced("verifier"))
        await asyncio.wait_for(watch.announced("solver"), 1)
        await asyncio.sleep(0.3)
        assert not held.done()
        await publish_policy(nc.jetstream(), names, "verifier", tmp_path / "v", final=True)
        await watch.poll()
        await asyncio.wait_for(held, 1)
        assert (watch.warming, watch.finished) == (set(), {"verifier"})  # the solver goes on
        # A trainer started again (a new epoch) publishes non-final versions: ask it again.
        await publish_policy(nc.jetstream(), names, "verifier", tmp_path / "again", epoch=1)
        await watch.poll()
        assert (watch.warming, watch.finished) == (set(), set())
    finally:
        watcher.cancel()
        await rt.close()
        await nc.close()


async def test_in_sync_mode_no_trainer_counts_as_warming_since_rounds_wait_for_all(
    nats_server: NatsServer,
) -> None:
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver", "verifier"])
    config = WorkerConfig(
        namespace="t",
        job=names.job,
        role=Role.WORKFLOW,
        nats_url=nats_server.url,
        spec=spec("solver-verifier", mode="sync"),
    )
    rt = await Runtime.connect(config, "workflow-0")
    try:
        watch = runner_main.build_workflow(rt).trainers
        await watch.poll()  # nothing announced
        assert watch.warming == set()
    finally:
        await rt.close()
        await nc.close()


async def test_async_runs_ask_each_policy_only_while_its_trainer_can_take_more(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """maxStaleness 0 and batches of 8: the runner asks a policy for more only once the test,
    acting as both trainers, acknowledges what is queued; and the verifier, which episodes skip
    while it has no room, is asked again each time its trainer takes a batch."""
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("solver-verifier").model_copy(deep=True)
    job.algorithm.max_staleness = 0
    for spec_of in job.policies:
        spec_of.trainer.batch_size = 8
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await natsconfig.ensure(js, names, ["solver", "verifier"])
    trainers = {
        policy: await js.pull_subscribe(
            names.trajectories_subject(policy),
            durable=JobNames.trainer_consumer,
            stream=names.trajectories_stream(policy),
        )
        for policy in ("solver", "verifier")
    }
    runtimes, tasks, runner = await start_workers(nats_server.url, js, names, job, tmp_path)

    async def backlog(policy: str) -> int:
        info = await js.consumer_info(names.trajectories_stream(policy), JobNames.trainer_consumer)
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def settled() -> dict[str, int]:
        """Both backlogs once nothing more arrives for a second."""
        last: dict[str, int] = {}

        async def unchanged() -> dict[str, int] | None:
            nonlocal last
            now = {policy: await backlog(policy) for policy in trainers}
            staleness = runner.admission.staleness
            idle = now == last and not any(staleness.in_flight.values())  # type: ignore[union-attr]
            last = now
            return now if idle else None

        return await wait_until_async(
            "both backlogs unchanged for a second", unchanged, timeout=120, interval=1.0
        )

    verdicts = []
    try:
        for _ in range(6):  # six "steps" of both trainers
            queued = await settled()
            # A batch of answers, give or take one episode's group asked for while the backlog
            # read was not yet current; verdicts only while the verifier had room when its
            # episode began (episodes skip it otherwise), and never more than a batch and an
            # episode's two verdict groups.
            assert 8 <= queued["solver"] <= 8 + 4, queued
            assert queued["verifier"] <= 8 + 8, queued
            verdicts.append(queued["verifier"])
            for policy, count in queued.items():
                if count:
                    for msg in await trainers[policy].fetch(count, timeout=10):
                        await msg.ack()
        # The verifier, skipped while it had no room, was asked again once it had: it got
        # verdicts in several rounds, not only before its first batch was full.
        assert sum(1 for count in verdicts if count) >= 3, verdicts
    finally:
        await stop_workers(runtimes, tasks)
        await nc.close()


async def test_async_requests_wait_for_the_weights_the_trainers_heartbeat_says_it_trains_from(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The solver's trainer says (its heartbeat) it trains from version 3, and maxStaleness is
    1: samples made from the version-0 weights its rollout worker has would be dropped, so
    none are made; once versions 1 and 2 are published, samples come from version 2 or later."""
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single").model_copy(deep=True)
    job.algorithm.max_staleness = 1
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await natsconfig.ensure(js, names, ["solver", "verifier"])
    kv = await js.key_value(names.heartbeats_bucket)
    beat = Heartbeat(
        pod="solver-trainer-0", role="trainer", policy="solver", weight_version=3, at=0
    )
    await kv.put(
        JobNames.heartbeat_key("solver", "trainer", beat.pod), beat.model_dump_json().encode()
    )
    sub = await js.subscribe(names.trajectories_subject("solver"))
    runtimes, tasks, runner = await start_workers(nats_server.url, js, names, job, tmp_path)
    try:
        await asyncio.wait_for(runner.trainers.versions_read.wait(), 10)  # before its first episode
        assert runner.trainers.versions == {"solver": 3}
        with pytest.raises(nats.errors.TimeoutError):
            await sub.next_msg(timeout=3)  # held back: version 0 is too old
        model, _ = models.make_model(
            ModelSource(path="tiny-llama://wf-test", dtype="float32"), cache_dir=tmp_path / "m"
        )
        state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
        store = await WeightStore.open(js, names.weights_bucket("solver"))
        publisher = WeightPublisher(store, names, "solver", keyframe_every=4)
        for version in (1, 2):
            await publisher.publish(state, version=version)
        await store.close()
        got = [
            Trajectory.model_validate_json((await sub.next_msg(timeout=60)).data) for _ in range(8)
        ]
        assert min(t.weight_version for t in got) >= 2
    finally:
        await sub.unsubscribe()
        await stop_workers(runtimes, tasks)
        await nc.close()


async def alike_and_mixed(episode: Episode) -> None:
    """A workflow for the next test: per episode, a group of the solver's rewarded alike and one
    whose rewards differ, from a made-up response (no rollout worker needed)."""
    completion = Completion(tokens=[3], logprobs=[-1.0], text="3", finish_reason="stop")
    response = GenerationResponse(
        id=episode.id, pod="test", weight_version=0, prompt_tokens=[1, 2], completions=[completion]
    )
    for i in range(4):
        await episode.emit("solver", "alike", response, 0, 1.0)
        await episode.emit("solver", "mixed", response, 0, float(i % 2))
    await asyncio.sleep(0.05)


@pytest.mark.parametrize("uniform", ["refill", "skip"])
async def test_async_runs_send_no_uniform_groups_of_a_policy_that_refills_its_batches(
    nats_server: NatsServer, uniform: str
) -> None:
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single").model_copy(deep=True)
    job.policies[0].trainer.uniform_groups = UniformGroups(uniform)
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver", "verifier"])
    config = WorkerConfig(
        namespace="t", job=names.job, role=Role.WORKFLOW, nats_url=nats_server.url, spec=job
    )
    rt = await Runtime.connect(config, "workflow-0")
    runner = WorkflowRunner(
        rt, FunctionWorkflow(alike_and_mixed, "alike"), load_task(job.workflow.task), concurrency=1
    )
    running = asyncio.create_task(runner.run())
    try:
        got = await collect(nc, names, "solver", 16)
    finally:
        rt.stopping.set()
        await asyncio.wait_for(running, timeout=60)
        await rt.close()
        await nc.close()
    kinds = {t.group_id.rsplit("/", 1)[1] for t in got}
    if uniform == "refill":
        assert kinds == {"mixed"}
        # Whole episodes only, each sending its four differing samples and leaving out four.
        leave_out = runner.emission.leave_out
        sent, left_out = leave_out.sent["solver"], leave_out.left_out["solver"]
        assert sent == left_out == 4 * runner.episodes
    else:  # skip: the trainer leaves them out, the runner sends everything
        assert kinds == {"alike", "mixed"}
        assert runner.emission.leave_out.left_out == {}


async def settled_then_stuck(episode: Episode) -> None:
    """A workflow for the next test: a group of the solver's whose rewards differ, settled;
    then another, and an episode that never ends (as one waiting for a slow verifier)."""
    completion = Completion(tokens=[3], logprobs=[-1.0], text="3", finish_reason="stop")
    response = GenerationResponse(
        id=episode.id,
        pod="test",
        weight_version=0,
        prompt_tokens=[1, 2],
        completions=[completion] * 4,
    )
    for i in range(4):
        await episode.emit("solver", "settled", response, i, float(i % 2))
    await episode.settle()
    for i in range(4):
        await episode.emit("solver", "unsettled", response, i, float(i % 2))
    await asyncio.Event().wait()


async def test_a_refilled_policys_settled_groups_go_out_before_the_episode_ends(
    nats_server: NatsServer,
) -> None:
    """What an episode settled is sent at once; what it emitted after, and never settled before
    it was cut short, is not."""
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single").model_copy(deep=True)
    job.policies[0].trainer.uniform_groups = UniformGroups.REFILL
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await natsconfig.ensure(js, names, ["solver", "verifier"])
    config = WorkerConfig(
        namespace="t", job=names.job, role=Role.WORKFLOW, nats_url=nats_server.url, spec=job
    )
    rt = await Runtime.connect(config, "workflow-0")
    task = load_task(job.workflow.task)
    runner = WorkflowRunner(
        rt, FunctionWorkflow(settled_then_stuck, "stuck"), task, concurrency=1, drain_timeout=0.5
    )
    running = asyncio.create_task(runner.run())
    try:
        got = await collect(nc, names, "solver", 4)
        assert {t.group_id.rsplit("/", 1)[1] for t in got} == {"settled"}
        assert len({t.id for t in got}) == 4
    finally:
        rt.stopping.set()
        await asyncio.wait_for(running, timeout=60)
        await rt.close()
    info = await js.stream_info(names.trajectories_stream("solver"))
    await nc.close()
    assert info.state.messages == 4  # the unsettled group of the episode cut short: not sent
    assert runner.episodes == 0


async def long_short_and_chat(episode: Episode) -> None:
    """A workflow for the next test: one in three episodes asks with a prompt longer than the
    policy takes, one with chat messages its tokenizer has no template for; the third is fine."""
    kind = episode.rng.randrange(3)
    prompt: Any = ["1+1=", "1+1+1+1+1+1+1+1=", [{"role": "user", "content": "1+1="}]][kind]
    response = await episode.generate("solver", prompt, 2)
    for i in range(len(response.completions)):
        await episode.emit("solver", "g", response, i, float(i))


async def test_prompts_a_policy_cannot_take_drop_their_episodes_counted_and_the_runner_goes_on(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single").model_copy(deep=True)
    job.policies[0].max_prompt_tokens = 8  # "1+1=" is 5 tokens with BOS; the long one 17
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver"])
    runtimes, tasks, runner = await start_workers(
        nats_server.url, nc.jetstream(), names, job, tmp_path
    )
    runner.workflow = FunctionWorkflow(long_short_and_chat, "long-short-and-chat")
    try:
        got = await collect(nc, names, "solver", 6)
        await wait_until_async(
            "2 dropped prompts and an episode done",
            lambda: runner.dropped_prompts >= 2 and runner.episodes >= 1,
            timeout=60,
        )
        await runner.rt.beat()  # the counts reach the runner's heartbeat
        entry = await nc.jetstream().key_value(names.heartbeats_bucket)
        beat = Heartbeat.model_validate_json(
            (await entry.get(JobNames.heartbeat_key(None, "workflow", "workflow-0"))).value or b""
        )
    finally:
        await stop_workers(runtimes, tasks)
        await nc.close()
    assert beat.dropped_prompts >= 2
    assert all(len(t.prompt_tokens) == 5 for t in got)  # only the short prompt got through
    assert runner.dropped_prompts >= 2
    assert runner.failed == 0


async def judged_or_asked(episode: Episode) -> None:
    """A workflow for the next test: the solver answers, then, in turn, the judge (whose
    pool never answers) is asked for a verdict (`judge`) or plainly (`generate`)."""
    response = await episode.generate("solver", "1+1=", 2)
    if episode.rng.randrange(2):
        await episode.judge("judge", "is 2 right?", lambda text: 1.0)
    else:
        await episode.generate("judge", "1+1=", 1)
    for i in range(len(response.completions)):
        await episode.emit("solver", "g", response, i, 1.0)


async def test_a_judge_or_pool_that_never_answers_drops_episodes_counted_by_reason(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single").model_copy(deep=True)
    judge = job.policies[0].model_copy(update={"name": "judge", "frozen": True})
    job.policies.append(judge)
    job.workflow.judge.timeout_seconds = 0.6
    job.workflow.name = f"{__name__}:judged_or_asked"  # two policies: not `single`
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver", "judge"])
    runtimes, tasks, runner = await start_workers(
        nats_server.url, nc.jetstream(), names, job, tmp_path, unserved=("judge",)
    )
    runner.generation.request_timeout, runner.generation.retries = 0.3, 1
    try:
        await wait_until_async(
            "episodes dropped for both reasons",
            lambda: (
                {("judge", "judge"), ("judge", "generation")}
                <= set(runner.accounts.dropped_by_reason)
            ),
            timeout=60,
        )
        await runner.rt.beat()
        entry = await nc.jetstream().key_value(names.heartbeats_bucket)
        beat = Heartbeat.model_validate_json(
            (await entry.get(JobNames.heartbeat_key(None, "workflow", "workflow-0"))).value or b""
        )
        trajectories = await nc.jetstream().stream_info(names.trajectories_stream("solver"))
    finally:
        await stop_workers(runtimes, tasks)
        await nc.close()
    assert set((beat.dropped_episodes or {})["judge"]) == {"judge", "generation"}
    assert runner.failed == 0
    assert runner.episodes == 0
    assert trajectories.state.messages == 0  # nothing of a dropped episode was sent


class RewardAlwaysFails:
    """The job's task with a user's reward that raises on every completion."""

    def __init__(self, task: Any) -> None:
        self.task, self.name = task, task.name

    def sample(self, rng: Any) -> Any:
        return self.task.sample(rng)

    def held_out(self) -> list[Any]:
        return list(self.task.held_out())

    def reward(self, problem: Any, completion: str) -> float:
        raise RewardFailed(f"reward score on problem {problem.prompt!r}: raised KeyError('answer')")


async def test_a_reward_failing_on_every_sample_stops_the_runner_as_invalid_input(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single")
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver"])
    runtimes, tasks, runner = await start_workers(
        nats_server.url, nc.jetstream(), names, job, tmp_path
    )
    runner.task = RewardAlwaysFails(runner.task)
    runner.accounts.reward_health.limit = 12
    try:
        error = await stopped_by_itself(tasks[-1], "with a reward that never works")
    finally:
        await stop_workers(runtimes, tasks)
        await nc.close()
    assert isinstance(error, RewardsFailing)
    assert "failed on the last" in str(error)
    assert "raised KeyError('answer')" in str(error)
    assert runner.dropped_samples >= 12
    assert runner.accounts.reward_health.scored == 0


async def test_a_full_request_queue_stops_the_runner_saying_so_instead_of_hanging(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single")
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await natsconfig.ensure(js, names, ["solver"])
    runtimes, tasks, runner = await start_workers(nats_server.url, js, names, job, tmp_path)
    # Then the queue has no room for even one request (its real limit: REQUEST_CAP requests).
    config = (await js.stream_info(names.requests_stream("solver"))).config
    config.max_bytes = 1
    await js.update_stream(config)
    try:
        error = await stopped_by_itself(tasks[-1], "with a request queue that takes nothing")
    finally:
        await stop_workers(runtimes, tasks)
        await nc.close()
    assert isinstance(error, StorageFull)
    assert "request queue of policy 'solver' is full" in str(error)
    assert runner.fatal is error


async def test_a_runner_replacing_one_of_the_same_name_sends_requests_the_queue_keeps(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Request ids are message ids, deduplicated by the stream for two minutes: a runner that
    takes over a killed one's pod name within them must not send its ids again."""
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single")
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await natsconfig.ensure(js, names, ["solver", "verifier"])
    stream = names.requests_stream("solver")
    for policy in ("solver", "verifier"):  # announced weights: the runner asks for samples
        await publish_policy(js, names, policy, tmp_path)

    async def waiting() -> int:
        return int((await js.stream_info(stream)).state.messages)

    try:
        for life in (1, 2):  # no rollout worker: every request stays in the queue
            config = WorkerConfig(
                namespace="t", job=names.job, role=Role.WORKFLOW, nats_url=nats_server.url, spec=job
            )
            rt = await Runtime.connect(config, "workflow-0")
            runner = runner_main.build_workflow(rt)
            runner.drain_timeout = 0.5
            running = asyncio.create_task(runner.run())
            concurrency = runner.concurrency

            async def queued(least: int = life * concurrency) -> bool:
                return await waiting() >= least

            await wait_until_async(f"{life * concurrency} requests queued", queued, timeout=60)
            rt.stopping.set()
            await asyncio.wait_for(running, timeout=60)
            await rt.close()
            assert await waiting() >= life * concurrency, life  # the second life's are kept too
    finally:
        await natsconfig.remove(js, names, ["solver", "verifier"])
        await nc.close()


async def test_a_stopping_runner_waits_for_its_episodes_only_while_generation_replies_come(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """No rollout worker answers (the whole job is stopping, as on a Kueue eviction): the
    runner gives up on its episodes once no reply came for `drain_quiet`, long before its
    `drain_timeout`, and sends nothing of them."""
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single")
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await natsconfig.ensure(js, names, ["solver", "verifier"])
    for policy in ("solver", "verifier"):  # announced weights: the runner asks for samples
        await publish_policy(js, names, policy, tmp_path)
    config = WorkerConfig(
        namespace="t", job=names.job, role=Role.WORKFLOW, nats_url=nats_server.url, spec=job
    )
    rt = await Runtime.connect(config, "workflow-0")
    runner = runner_main.build_workflow(rt)
    runner.drain_timeout, runner.drain_quiet = 120.0, 1.0
    running = asyncio.create_task(runner.run())
    try:

        async def asked() -> bool:
            return bool(runner.generation.waiting)

        await wait_until_async("requests waiting for replies", asked, timeout=60)
        rt.stopping.set()
        clock = asyncio.get_running_loop().time
        began = clock()
        await asyncio.wait_for(running, timeout=60)  # not drain_timeout's 120 s
        took = clock() - began
    finally:
        await rt.close()
        await natsconfig.remove(js, names, ["solver", "verifier"])
        await nc.close()
    assert took >= runner.drain_quiet  # it did wait for replies, that long
    assert runner.episodes == 0


async def test_a_trajectory_nats_never_stored_stops_the_runner_naming_it(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trajectories go out through a window of outstanding publishes; one that NATS never
    stores (its stream deleted, past `outage.retry`'s patience) is not lost silently: the
    runner stops with it as its failure."""
    monkeypatch.setenv(outage.PATIENCE_ENV, "1")
    names = JobNames(namespace="t", job=f"wf{uuid.uuid4().hex[:6]}")
    job = spec("single")
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await natsconfig.ensure(js, names, ["solver"])
    runtimes, tasks, runner = await start_workers(nats_server.url, js, names, job, tmp_path)
    try:
        await collect(nc, names, "solver", 1)  # trajectories flow; then their stream goes
        await js.delete_stream(names.trajectories_stream("solver"))
        error = await stopped_by_itself(tasks[-1], "losing trajectories")
    finally:
        await stop_workers(runtimes, tasks)
        await nc.close()
    assert isinstance(error, Unavailable)
    assert "trajectory" in str(error)
    assert runner.fatal is error
