"""Scale-down is drain-first: with requests in flight, none is lost or answered twice.

The rollout pods here run the FAKE worker (tests/fakes/fake_worker.py); the data-plane
work re-runs this scenario with real rollout workers.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import nats
import pytest
from kubernetes import client, watch
from nats.aio.msg import Msg

from polyrl.api.messages import Drained, Heartbeat, WorkerState
from polyrl.api.naming import JobNames
from polyrl.testing.kube import Kubectl, wait_for
from polyrl.testing.natsserver import NatsServer

from .helpers import apply, job_doc, live, pods, wait_running

REQUESTS = 40


def watch_deletions(
    api: client.ApiClient, ns: str, seen: dict[str, float], stop: threading.Event
) -> threading.Thread:
    def follow() -> None:
        core = client.CoreV1Api(api)
        while not stop.is_set():
            for event in watch.Watch().stream(core.list_namespaced_pod, ns, timeout_seconds=2):
                if event["type"] == "DELETED":
                    seen.setdefault(event["object"].metadata.name, time.time())

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


async def run_load(
    url: str, names: JobNames, kubectl: Kubectl, ns: str
) -> tuple[list[dict[str, str]], dict[str, float]]:
    nc = await nats.connect(url)
    replies: list[dict[str, str]] = []
    drained: dict[str, float] = {}
    inbox = f"test.replies.{uuid.uuid4().hex}"
    done = asyncio.Event()

    async def on_reply(msg: Msg) -> None:
        replies.append(json.loads(msg.data))
        if len(replies) >= REQUESTS:
            done.set()

    async def on_drained(msg: Msg) -> None:
        drained.setdefault(Drained.model_validate_json(msg.data).pod, time.time())

    await nc.subscribe(inbox, cb=on_reply)
    await nc.subscribe(names.drained_wildcard, cb=on_drained)
    js = nc.jetstream()
    for i in range(REQUESTS):
        body = {"id": f"r{i}", "reply_to": inbox, "work_seconds": 0.25}
        await js.publish(
            names.requests_subject("solver"),
            json.dumps(body).encode(),
            headers={"Nats-Msg-Id": f"r{i}"},
        )
    await asyncio.sleep(1.0)  # every pod now holds a request
    await asyncio.to_thread(kubectl, "scale", "pg", "drain-solver", "-n", ns, "--replicas=1")
    await asyncio.wait_for(done.wait(), timeout=90)
    await asyncio.sleep(1.0)  # a duplicate would arrive now
    await nc.close()
    return replies, drained


@pytest.mark.slow
def test_scale_down_with_requests_in_flight_loses_nothing_and_drains_before_deleting(
    kubectl: Kubectl, exec_ns: str, nats_server: NatsServer, kube_api: client.ApiClient
) -> None:
    apply(kubectl, exec_ns, job_doc("drain", rollout={"replicas": 3, "drainTimeoutSeconds": 60}))
    rollouts = "polyrl.dev/policy-group=drain-solver,polyrl.dev/role=rollout"
    wait_running(kubectl, exec_ns, rollouts, 3, timeout=60)
    names = JobNames(namespace=exec_ns, job="drain")
    wait_for(
        "3 fake rollout workers serving",
        lambda: asyncio.run(serving(nats_server.url, names, 3)) == 3,
        timeout=60,
    )
    deleted: dict[str, float] = {}
    stop = threading.Event()
    watcher = watch_deletions(kube_api, exec_ns, deleted, stop)
    try:
        replies, drained = asyncio.run(run_load(nats_server.url, names, kubectl, exec_ns))
        wait_for("the drained pods deleted", lambda: set(drained) <= set(deleted), timeout=60)
    finally:
        stop.set()
        watcher.join(timeout=10)
    ids = [r["id"] for r in replies]
    assert sorted(ids) == sorted(f"r{i}" for i in range(REQUESTS))  # each exactly once
    assert set(drained) == {"drain-solver-rollout-1", "drain-solver-rollout-2"}
    for pod, at in drained.items():
        assert at < deleted[pod], f"{pod} was deleted before it said Drained"
    served_by = {r["pod"] for r in replies}
    assert "drain-solver-rollout-0" in served_by
    assert len(live(pods(kubectl, exec_ns, rollouts))) == 1
