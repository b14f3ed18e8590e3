"""A worker serves its heartbeat's figures to Prometheus on POLYRL_METRICS_PORT, read back
with Prometheus's own text parser; the values follow the worker as it goes."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest
from tests import scrape as scraping

from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.messages import WorkerState
from polyrl.api.resources import RLJobSpec
from polyrl.local import processes
from polyrl.local.natsserver import NatsServer
from polyrl.workers.runtime import prometheus as worker_metrics
from polyrl.workers.runtime.worker import Runtime


def scrape(port: int) -> dict[str, float]:
    return scraping.worker_metrics(f"http://127.0.0.1:{port}/metrics")


async def test_a_workers_figures_are_scraped_with_their_names_and_follow_its_heartbeats(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = processes.free_port()
    monkeypatch.setenv(worker_metrics.PORT_ENV, str(port))
    spec = RLJobSpec.model_validate(
        {"policies": [{"name": "solver", "model": {"path": "tiny-llama://m"}}]}
    )
    config = WorkerConfig(
        namespace="t", job="metrics", role=Role.ROLLOUT, policy="solver",
        nats_url=nats_server.url, spec=spec,
    )  # fmt: skip
    rt = await Runtime.connect(config, "metrics-rollout-0")
    beating = asyncio.create_task(rt.heartbeat_forever())
    try:
        rt.figures = {"requests_served": 3, "weight_version": 2, "tokens_per_second": 120.5}
        await rt.beat()
        first = await asyncio.to_thread(scrape, port)
        rt.figures = {"requests_served": 10, "weight_version": 5, "tokens_per_second": 80.0,
                      "sync_seconds": 0.25, "sync_bytes": 4096, "changed_fraction": 0.01,
                      "queue_depth": 12, "dropped_episodes": {"solver": {"tool": 2}}}  # fmt: skip
        rt.dead_letters = 1
        assert rt.exported is not None
        rt.exported.observe_staleness({0: 3, 2: 1})
        await rt.beat()
        second = await asyncio.to_thread(scrape, port)
    finally:
        beating.cancel()
        await rt.close()
    assert first["polyrl_worker_info"] == 1.0
    assert set(worker_metrics.FIGURES) <= {n.removeprefix("polyrl_worker_") for n in first}
    assert (first["polyrl_worker_requests_served"], second["polyrl_worker_requests_served"]) == (
        3.0,
        10.0,
    )
    assert (first["polyrl_worker_weight_version"], second["polyrl_worker_weight_version"]) == (
        2.0,
        5.0,
    )
    assert second["polyrl_worker_tokens_per_second"] == 80.0
    assert (first["polyrl_worker_dead_letters"], second["polyrl_worker_dead_letters"]) == (0, 1)
    assert (first["polyrl_worker_sync_bytes"], second["polyrl_worker_sync_bytes"]) == (0, 4096)
    assert second["polyrl_worker_queue_depth"] == 12
    assert "polyrl_worker_dropped_episodes" not in first  # none yet: no series
    assert second["polyrl_worker_dropped_episodes"] == 2  # {of="solver", reason="tool"}
    assert second["polyrl_worker_changed_fraction"] == 0.01
    assert (first["polyrl_worker_staleness_count"], second["polyrl_worker_staleness_count"]) == (
        0, 4,
    )  # fmt: skip
    assert second["polyrl_worker_staleness_sum"] == 2.0


def test_a_port_that_cannot_be_had_leaves_the_worker_without_metrics_not_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(worker_metrics.PORT_ENV, "not-a-port")
    assert worker_metrics.from_env(ready=lambda: None) is None
    monkeypatch.delenv(worker_metrics.PORT_ENV)
    assert worker_metrics.from_env(ready=lambda: None) is None


def ready(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def test_a_worker_is_ready_once_a_heartbeat_said_it_serves_and_not_while_it_drains(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = processes.free_port()
    monkeypatch.setenv(worker_metrics.PORT_ENV, str(port))
    spec = RLJobSpec.model_validate(
        {"policies": [{"name": "solver", "model": {"path": "tiny-llama://m"}}]}
    )
    config = WorkerConfig(
        namespace="t", job="ready", role=Role.ROLLOUT, policy="solver",
        nats_url=nats_server.url, spec=spec,
    )  # fmt: skip
    rt = await Runtime.connect(config, "ready-rollout-0")
    beating = asyncio.create_task(rt.heartbeat_forever())
    try:
        await rt.beat()
        starting = await asyncio.to_thread(ready, port)
        rt.state = WorkerState.SERVING  # not yet said in a heartbeat
        unsaid = await asyncio.to_thread(ready, port)
        await rt.enter(WorkerState.SERVING)
        serving = await asyncio.to_thread(ready, port)
        rt.state = WorkerState.DRAINING
        draining = await asyncio.to_thread(ready, port)
        scraped = await asyncio.to_thread(scrape, port)  # the figures, on the same port
    finally:
        beating.cancel()
        await rt.close()
    assert starting == (503, "rollout is starting\n")
    assert unsaid == (503, "rollout is serving (not yet in a heartbeat)\n")
    assert serving == (200, "ready\n")
    assert draining[0] == 503
    assert scraped["polyrl_worker_info"] == 1.0
