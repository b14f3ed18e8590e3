"""Scale-down is drain-first: with requests in flight, none is lost or answered twice.

The scenario runs twice: with the FAKE worker (tests/fakes/fake_worker.py), whose requests
take a set time, and with the real rollout workers (`polyrl worker rollout`, the torch
engine on a tiny model), which speak the same DrainRequest / DrainAck / Drained protocol.
For the real workers the test plays the trainer's publishing part (the model bundle and
weight version 0, with the library functions the trainer uses) and the trainer pod runs
the fake: the scenario is about the rollout pool, a real trainer would add a minute of
start-up and training load on a small machine, and fixed weights keep every reply at
version 0 (the real trainer's publishing is covered end to end by
tests/e2e/test_operator_job.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from nats.aio.msg import Msg
from pydantic import ValidationError
from tests.operator_stack import PodLogs, explained

from polyrl.api import natsconfig
from polyrl.api.messages import DrainAck, Drained, Heartbeat, WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.resources import ModelSource
from polyrl.api.wire import GenerationRequest, GenerationResponse
from polyrl.local.natsserver import NatsServer
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until, wait_until_async
from polyrl.workers.models.chartokenizer import build_tokenizer

from .helpers import apply, job_doc, live, pods, wait_ready, wait_running

REQUESTS = 40
ROLLOUTS = "polyrl.dev/policy-group=drain-solver,polyrl.dev/role=rollout"
# Real workers: each request asks for N_COMPLETIONS of up to MAX_NEW_TOKENS tokens and a pod
# takes up to MAX_BATCH requests at a time, so a batch takes about a second on a busy
# 2-core machine and the 40 requests keep the pool busy well past the scale-down.
N_COMPLETIONS = 4
MAX_NEW_TOKENS = 64
MAX_BATCH = 4


def watch_deletions(
    api: client.ApiClient, ns: str, seen: dict[str, float], stop: threading.Event
) -> threading.Thread:
    """Record when each pod of `ns` is deleted.

    Each 2-second watch resumes from the last resource version it saw: a watch started
    afresh would miss a deletion that fell between two of them.
    """

    def follow() -> None:
        core = client.CoreV1Api(api)
        version = core.list_namespaced_pod(ns).metadata.resource_version
        while not stop.is_set():
            stream = watch.Watch().stream(
                core.list_namespaced_pod, ns, resource_version=version, timeout_seconds=2
            )
            try:
                for event in stream:
                    version = event["object"].metadata.resource_version
                    if event["type"] == "DELETED":
                        seen.setdefault(event["object"].metadata.name, time.time())
            except ApiException as e:  # 410 Gone: the version was compacted away; relist
                if e.status != 410:
                    raise
                version = core.list_namespaced_pod(ns).metadata.resource_version

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread


async def serving(url: str, names: JobNames, count: int) -> int:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(names.heartbeats_bucket)
        keys = [k for k in await kv.keys() if ".rollout." in k]
        beats = [Heartbeat.model_validate_json((await kv.get(k)).value or b"") for k in keys]
        return sum(1 for b in beats if b.state == WorkerState.SERVING and time.time() - b.at < 3)
    except Exception:
        return 0
    finally:
        await nc.close()


@dataclass
class Load:
    """What the test saw while the pool served its requests and was scaled down."""

    replies: list[dict[str, Any]] = field(default_factory=list)
    reply_order: list[int] = field(default_factory=list)  # each reply's place in `seen`
    drained: dict[str, float] = field(default_factory=dict)  # pod -> when Drained arrived
    drained_order: dict[str, int] = field(default_factory=dict)  # pod -> its place in `seen`
    acks: dict[str, DrainAck] = field(default_factory=dict)  # pod -> its DrainAck
    seen: int = 0  # replies and Drained messages, counted in arrival order

    def replied_after_drained(self, pod: str) -> list[str]:
        """Requests `pod` answered after it had said Drained (it must answer none)."""
        return [
            r["id"]
            for r, at in zip(self.replies, self.reply_order, strict=True)
            if r["pod"] == pod and at > self.drained_order[pod]
        ]


POOL = {f"drain-solver-rollout-{i}" for i in range(3)}


def drained_two(load: Load, kubectl: Kubectl, ns: str) -> str:
    """Two of the three pods drained and the third left serving; its name.

    Which two is the operator's documented order (`scaling.victims`, unit-tested): the
    newest, unless a pod's Ready condition lapsed when the scale-down came (a probe that
    timed out on a loaded machine), which sends it first. Either way none may be lost."""
    assert set(load.drained) < POOL
    assert len(load.drained) == 2
    [survivor] = POOL - set(load.drained)
    assert [p["metadata"]["name"] for p in live(pods(kubectl, ns, ROLLOUTS))] == [survivor]
    return survivor


def fake_request(i: int, inbox: str) -> bytes:
    return json.dumps({"id": f"r{i}", "reply_to": inbox, "work_seconds": 0.25}).encode()


def real_request(i: int, inbox: str) -> bytes:
    request = GenerationRequest(
        id=f"r{i}",
        episode_id=f"drain-test-{i}",
        policy="solver",
        prompt_tokens=build_tokenizer()(f"{i}+{i}=")["input_ids"],
        n=N_COMPLETIONS,
        max_new_tokens=MAX_NEW_TOKENS,
        reply_to=inbox,
    )
    return request.model_dump_json().encode()


async def run_load(
    url: str, names: JobNames, kubectl: Kubectl, ns: str, request: Callable[[int, str], bytes]
) -> Load:
    nc = await nats.connect(url)
    load = Load()
    # Replies come back under the policy's control subjects, so that one subscription sees
    # them and the Drained messages in the order each pod sent them (NATS keeps a
    # publisher's order on one subscription; callbacks of two subscriptions may interleave).
    control = f"{names.prefix}.solver.control"
    inbox = f"{control}.test-replies.{uuid.uuid4().hex}"
    done = asyncio.Event()

    async def on_control(msg: Msg) -> None:
        if msg.subject == inbox:
            load.replies.append(json.loads(msg.data))
            load.reply_order.append(load.seen)
            if len(load.replies) >= REQUESTS:
                done.set()
        elif msg.subject.startswith(f"{control}.drained."):
            pod = Drained.model_validate_json(msg.data).pod
            load.drained.setdefault(pod, time.time())
            load.drained_order.setdefault(pod, load.seen)
        else:
            return  # a drain request
        load.seen += 1

    async def on_inbox(msg: Msg) -> None:
        # The operator asks with a NATS request, so a pod's DrainAck goes to an _INBOX subject.
        if b'"in_flight"' in msg.data:
            try:
                ack = DrainAck.model_validate_json(msg.data)
            except ValidationError:
                return  # a heartbeat (a KV watch delivers to an inbox too)
            load.acks.setdefault(ack.pod, ack)

    subs = [
        await nc.subscribe(f"{control}.>", cb=on_control),
        await nc.subscribe("_INBOX.>", cb=on_inbox),
    ]
    js = nc.jetstream()
    try:
        sent = [
            await js.publish(
                names.requests_subject("solver"),
                request(i, inbox),
                headers={"Nats-Msg-Id": f"r{i}"},
            )
            for i in range(REQUESTS)
        ]
        # Every pod holds requests: it answered one and goes on with the rest.
        await wait_until_async(
            "a reply from each of the 3 pods",
            lambda: len({r["pod"] for r in load.replies}) == 3,
            timeout=60,
        )
        assert len(load.replies) < REQUESTS  # the scale-down comes under load
        await asyncio.to_thread(kubectl, "scale", "pg", "drain-solver", "-n", ns, "--replicas=1")
        await asyncio.wait_for(done.wait(), timeout=90)
        # The Drained messages follow the operator's drain requests, not the replies: a slow
        # operator can ask after the last reply.
        await wait_until_async(
            "Drained from both scaled-down pods", lambda: len(load.drained) >= 2, timeout=30
        )
        # A duplicate comes from a request delivered again, or from a worker answering twice
        # before it acknowledges: once every request is acknowledged, neither can come, and
        # what the server sent us before it said so is in our callbacks after a flush. The
        # requests are a work queue: one lives in the stream until it is acknowledged.
        stream, left = names.requests_stream("solver"), {ack.seq for ack in sent}

        async def all_acknowledged() -> bool:
            for seq in sorted(left):
                try:
                    await js.get_msg(stream, seq)
                except nats.js.errors.NotFoundError:
                    left.discard(seq)
                else:
                    return False
            return True

        await wait_until_async("every request acknowledged", all_acknowledged, timeout=30)
        await nc.flush()
        await wait_until_async(
            "the test's callbacks to take what arrived",
            lambda: not any(s.pending_msgs for s in subs),
        )
    finally:
        await nc.close()
    return load


def scale_down_under_load(
    kubectl: Kubectl,
    ns: str,
    url: str,
    api: client.ApiClient,
    request: Callable[[int, str], bytes],
) -> tuple[Load, dict[str, float]]:
    """Load the 3 serving pods, scale to 1; what was seen, and when each pod was deleted."""
    # Scale-down drains not-Ready pods first: a pod serving over NATS whose Ready condition
    # has not reached the API yet would be picked before the newest, so wait for all three.
    wait_ready(kubectl, ns, ROLLOUTS, 3)
    names = JobNames(namespace=ns, job="drain")
    deleted: dict[str, float] = {}
    stop = threading.Event()
    watcher = watch_deletions(api, ns, deleted, stop)
    try:
        load = asyncio.run(run_load(url, names, kubectl, ns, request))
        wait_until(
            "the drained pods deleted", lambda: set(load.drained) <= set(deleted), timeout=60
        )
    finally:
        stop.set()
        watcher.join(timeout=10)
    return load, deleted


@pytest.mark.slow
def test_scale_down_with_requests_in_flight_loses_nothing_and_drains_before_deleting(
    kubectl: Kubectl, exec_ns: str, nats_server: NatsServer, kube_api: client.ApiClient
) -> None:
    apply(kubectl, exec_ns, job_doc("drain", rollout={"replicas": 3, "drainTimeoutSeconds": 60}))
    wait_running(kubectl, exec_ns, ROLLOUTS, 3, timeout=60)
    names = JobNames(namespace=exec_ns, job="drain")
    wait_until(
        "3 fake rollout workers serving",
        lambda: asyncio.run(serving(nats_server.url, names, 3)) == 3,
        timeout=60,
    )
    load, deleted = scale_down_under_load(kubectl, exec_ns, nats_server.url, kube_api, fake_request)
    ids = [r["id"] for r in load.replies]
    assert sorted(ids) == sorted(f"r{i}" for i in range(REQUESTS))  # each exactly once
    survivor = drained_two(load, kubectl, exec_ns)
    for pod, at in load.drained.items():
        assert at < deleted[pod], f"{pod} was deleted before it said Drained"
    served_by = {r["pod"] for r in load.replies}
    assert survivor in served_by


async def publish_model(url: str, names: JobNames, workdir: Path) -> None:
    """The trainer's publishing part (Leader.start): model bundle, then weight version 0."""
    import torch  # the workers' side: only this test needs it

    from polyrl.workers.models import loading as models
    from polyrl.workers.weightsync import bundle
    from polyrl.workers.weightsync.publish import WeightPublisher
    from polyrl.workers.weightsync.store import WeightStore

    model, tokenizer = models.make_model(
        ModelSource(path="tiny-llama://drain", dtype="float32"), cache_dir=workdir / "models"
    )
    models.export(model, tokenizer, workdir / "export")
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await natsconfig.ensure(js, names, ["solver"])
        await bundle.publish(js, names, "solver", workdir / "export")
        store = await WeightStore.open(js, names.weights_bucket("solver"))
        publisher = WeightPublisher(store, names, "solver", keyframe_every=20)
        state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
        await publisher.publish(state, version=0)
        await store.close()
    finally:
        await nc.close()


@pytest.mark.slow
def test_real_rollout_workers_scaled_down_under_load_answer_every_request_once_and_drain_first(
    kubectl: Kubectl,
    real_rollouts_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    kube_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    ns = real_rollouts_ns
    names = JobNames(namespace=ns, job="drain")
    logs = PodLogs(cluster, ns, tmp_path / "pod-logs")
    started = time.monotonic()
    with explained(kubectl, operator, logs):
        doc = job_doc(
            "drain",
            rollout={"replicas": 3, "drainTimeoutSeconds": 60, "maxBatchSize": MAX_BATCH},
            # The workflow runner is real too: keep its own traffic to a trickle.
            workflow={"episodesInFlight": 1},
            algorithm={"groupSize": 2, "maxNewTokens": 2},
        )
        apply(kubectl, ns, doc)
        # While the pods start: rollout workers wait for the bundle, then for version 0.
        asyncio.run(publish_model(nats_server.url, names, tmp_path))
        print(f"bundle and version 0 published at {time.monotonic() - started:.0f}s")
        wait_running(kubectl, ns, ROLLOUTS, 3, timeout=60)

        def three_serving() -> bool:
            logs.collect()
            return asyncio.run(serving(nats_server.url, names, 3)) == 3

        wait_until("3 real rollout workers serving", three_serving, timeout=180, interval=1)
        print(f"3 rollout workers serving at {time.monotonic() - started:.0f}s")
        load, deleted = scale_down_under_load(kubectl, ns, nats_server.url, kube_api, real_request)
        logs.collect()
        print(
            f"all answered at {time.monotonic() - started:.0f}s; replies by pod "
            f"{Counter(r['pod'] for r in load.replies)}; drain acks {load.acks}"
        )

        ids = [r["id"] for r in load.replies]
        assert sorted(ids) == sorted(f"r{i}" for i in range(REQUESTS))  # each exactly once
        for reply in map(GenerationResponse.model_validate, load.replies):
            assert reply.error is None
            assert len(reply.completions) == N_COMPLETIONS
            assert reply.weight_version == 0
        drained_two(load, kubectl, ns)
        assert {r["pod"] for r in load.replies} == POOL
        assert set(load.acks) == set(load.drained)
        assert any(ack.in_flight > 0 for ack in load.acks.values())  # asked mid-batch
        for pod, at in load.drained.items():
            assert at < deleted[pod], f"{pod} was deleted before it said Drained"
            assert load.replied_after_drained(pod) == [], f"{pod} said Drained too early"
