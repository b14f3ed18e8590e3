"""A shared rollout pool (`rollout.servedBy`): one worker, one engine, two LoRA policies.

The test plays both trainers' publishing part (the solver's model bundle; each policy's frozen
base and adapter versions through the weight publisher) and talks to the worker only through
NATS, as the workflow runner does: each policy's requests on its own subject.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
import torch
from nats.aio.client import Client as NatsClient
from tests.unit.workers.engines.test_adapter_contract import adapter_state

from polyrl.api import natsconfig
from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.messages import Heartbeat, PoolShare, WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.resources import ModelSource, RLJobSpec
from polyrl.api.wire import GenerationRequest, GenerationResponse
from polyrl.local.natsserver import NatsServer
from polyrl.testing.waiting import wait_until_async
from polyrl.workers.models import loading as models
from polyrl.workers.models.adapters import Adapter
from polyrl.workers.rollout import engines
from polyrl.workers.rollout import main as rollout_main
from polyrl.workers.rollout.engines.base import SamplingParams
from polyrl.workers.rollout.worker import RolloutWorker
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.weightsync import bundle
from polyrl.workers.weightsync.announce import Payload
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.store import WeightStore

pytestmark = pytest.mark.slow
POLICIES = ("solver", "verifier")
RANK = 8  # the contract tests' adapters
MODEL = "tiny-llama://shared-pool"


@dataclass
class Pool:
    nc: NatsClient
    names: JobNames
    rt: Runtime
    worker: RolloutWorker
    base: dict[str, torch.Tensor]
    adapters: dict[str, dict[str, torch.Tensor]]
    publishers: dict[str, WeightPublisher]
    cache: Path

    def model(self) -> Any:
        return models.make_model(ModelSource(path=MODEL), cache_dir=self.cache)[0]


def job() -> RLJobSpec:
    lora = {"rank": RANK, "alpha": 16}
    return RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": MODEL},
                    "trainer": {"lora": lora},
                    "rollout": {"maxBatchSize": 8},
                },
                {
                    "name": "verifier",
                    "model": {"path": MODEL},
                    "trainer": {"lora": lora},
                    "rollout": {"servedBy": "solver"},
                },
            ]
        }
    )


async def publish_policy(
    js: Any, names: JobNames, policy: str, base: dict[str, torch.Tensor], adapter: Any
) -> WeightPublisher:
    store = await WeightStore.open(js, names.weights_bucket(policy))
    publisher = WeightPublisher(store, names, policy, keyframe_every=4, payload=Payload.ADAPTER)
    await publisher.publish_base(base)
    await publisher.publish(adapter)
    return publisher


@pytest.fixture
async def pool(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Pool]:
    names = JobNames(namespace="t", job=f"sp{uuid.uuid4().hex[:6]}")
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, list(POLICIES))
    model, tokenizer = models.make_model(ModelSource(path=MODEL), cache_dir=tmp_path / "m")
    models.export(model, tokenizer, tmp_path / "export")
    await bundle.publish(nc.jetstream(), names, "solver", tmp_path / "export")
    base = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    adapters = {p: adapter_state(seed, model) for seed, p in enumerate(POLICIES)}
    publishers = {
        p: await publish_policy(nc.jetstream(), names, p, base, adapters[p]) for p in POLICIES
    }
    config = WorkerConfig(
        namespace="t",
        job=names.job,
        role=Role.ROLLOUT,
        policy="solver",
        nats_url=nats_server.url,
        spec=job(),
    )
    rt = await Runtime.connect(config, "rollout-0")
    worker = await rollout_main.build_rollout(rt, bundle_timeout=30)
    task = asyncio.create_task(worker.run())
    beating = asyncio.create_task(rt.heartbeat_forever())  # as `polyrl worker` runs it
    await wait_until_async("the pool serving", lambda: rt.state == WorkerState.SERVING)
    yield Pool(nc, names, rt, worker, base, adapters, publishers, tmp_path / "m")
    rt.stopping.set()
    await asyncio.wait_for(task, timeout=30)
    beating.cancel()
    for publisher in publishers.values():
        await publisher.store.close()
    await rt.close()
    await nc.close()


async def ask(
    pool: Pool, asks: list[tuple[str, list[int]]], *, subject_of: str | None = None
) -> list[tuple[GenerationResponse, float]]:
    """Publish every (policy, prompt) at once, greedy; each reply with its seconds."""
    inbox = f"test.{uuid.uuid4().hex}"
    sub = await pool.nc.subscribe(inbox)
    sent = {}
    for i, (policy, prompt) in enumerate(asks):
        rid = f"{inbox}-{i:03d}"
        request = GenerationRequest(
            id=rid, episode_id=rid, policy=policy, prompt_tokens=prompt,
            max_new_tokens=6, temperature=0.0, reply_to=inbox,
        )  # fmt: skip
        subject = pool.names.requests_subject(subject_of or policy)
        await pool.nc.jetstream().publish(
            subject, request.model_dump_json().encode(), headers={"Nats-Msg-Id": rid}
        )
        sent[rid] = time.monotonic()
    replies = []
    for _ in asks:
        reply = GenerationResponse.model_validate_json((await sub.next_msg(timeout=60)).data)
        replies.append((reply, time.monotonic() - sent[reply.id]))
    await sub.unsubscribe()
    return sorted(replies, key=lambda r: r[0].id)


def alone(pool: Pool, policy: str, prompt: list[int]) -> list[int]:
    """Greedy ids of an engine holding this policy's adapter alone, built here."""
    model = pool.model()
    model.load_state_dict(pool.base)
    engine = engines.make_engine("torch", model)
    engine.load_adapter(Adapter(dict(pool.adapters[policy]), 16))  # type: ignore[attr-defined]
    return engine.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0))[0].tokens


async def beat(pool: Pool) -> Heartbeat:
    kv = await pool.nc.jetstream().key_value(pool.names.heartbeats_bucket)
    key = JobNames.heartbeat_key("solver", "rollout", "rollout-0")
    return Heartbeat.model_validate_json((await kv.get(key)).value or b"")


async def pool_figures(pool: Pool, ready: Any) -> dict[str, PoolShare]:
    """The pool's per-policy figures from its heartbeat, once `ready` holds (a beat is sent
    every couple of seconds)."""
    deadline = time.monotonic() + 20
    while True:
        shares = (await beat(pool)).pool
        if shares is not None and ready(shares):
            return shares
        assert time.monotonic() < deadline, f"no heartbeat with the figures: {shares}"
        await asyncio.sleep(0.5)


async def test_one_engine_serves_each_policy_its_own_adapter_and_counts_each(pool: Pool) -> None:
    prompt = [5, 9, 2, 17, 3]
    (solver, _), (verifier, _) = await ask(pool, [("solver", prompt), ("verifier", prompt)])
    assert solver.completions[0].tokens == alone(pool, "solver", prompt)
    assert verifier.completions[0].tokens == alone(pool, "verifier", prompt)
    assert solver.completions[0].tokens != verifier.completions[0].tokens
    assert (solver.weight_version, verifier.weight_version) == (0, 0)
    pool.adapters["verifier"] = adapter_state(7, pool.model())
    await pool.publishers["verifier"].publish(pool.adapters["verifier"])
    await wait_until_async("verifier at version 1", lambda: pool.worker._version("verifier") == 1)
    (again, _), = await ask(pool, [("verifier", prompt)])  # fmt: skip
    assert again.weight_version == 1
    assert again.completions[0].tokens == alone(pool, "verifier", prompt)
    shares = await pool_figures(pool, lambda s: s["verifier"].requests_served >= 2)
    assert shares["solver"].requests_served == 1
    assert shares["verifier"].requests_served == 2
    assert shares["verifier"].weight_version == 1


async def test_a_quiet_policy_is_not_kept_waiting_behind_a_busy_one_ten_times_its_load(
    pool: Pool,
) -> None:
    """10:1 skew: 80 solver requests and 8 verifier requests at once. The worker's turn
    rotates between the queues, so the verifier's requests are taken within the first
    rounds while the solver's wait their turn in a queue ten times as long."""
    asks = [("solver", [1 + i % 30, 4, 7]) for i in range(80)]
    asks += [("verifier", [2 + i, 5, 11]) for i in range(8)]
    replies = await ask(pool, asks)
    seconds = {p: [s for r, s in replies if r.id and _policy(asks, r.id) == p] for p in POLICIES}
    assert all(not r.error for r, _ in replies)
    assert max(seconds["verifier"]) < statistics.median(seconds["solver"])
    shares = await pool_figures(pool, lambda s: s["verifier"].requests_served >= 8)
    waits = {p: shares[p].queue_seconds_p50 for p in POLICIES}
    assert waits["verifier"] is not None
    assert waits["solver"] is not None
    assert waits["verifier"] < waits["solver"]


def _policy(asks: list[tuple[str, list[int]]], rid: str) -> str:
    return asks[int(rid.rsplit("-", 1)[1])][0]


async def test_a_request_in_another_policys_queue_is_refused_saying_so(pool: Pool) -> None:
    (reply, _), = await ask(pool, [("solver", [3, 4])], subject_of="verifier")  # fmt: skip
    assert reply.error is not None
    assert "'solver' in policy verifier's queue" in reply.error
    (fine, _), = await ask(pool, [("verifier", [3, 4])])  # fmt: skip
    assert fine.error is None


async def test_a_policy_whose_trainer_holds_another_base_is_refused_and_not_served(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its adapters would be served on weights they were not trained on: the sync fails,
    counted, and the pool never serves that policy."""
    from polyrl.workers.rollout.weights import EngineWeights

    names = JobNames(namespace="t", job=f"sp{uuid.uuid4().hex[:6]}")
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, list(POLICIES))
    model, _ = models.make_model(ModelSource(path=MODEL), cache_dir=tmp_path / "m")
    base = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    other = {k: v + 1 if "norm" in k else v for k, v in base.items()}
    solver = await publish_policy(nc.jetstream(), names, "solver", base, {})
    verifier = await publish_policy(
        nc.jetstream(), names, "verifier", other, adapter_state(1, model)
    )
    pool_base = (await solver.store.meta("base.key")).digest
    engine = engines.make_engine("torch", model)
    weights = EngineWeights(
        nc.jetstream(), names, "verifier", verifier.store, adapter_alpha=16, pool_base=pool_base
    )
    assert await weights.update(engine) is None
    assert (weights.version, weights.failures) == (None, 1)
    assert "verifier's base model differs from the one its shared pool holds" in caplog.text
    assert not engine._slots  # type: ignore[attr-defined]
    for publisher in (solver, verifier):
        await publisher.store.close()
    await nc.close()


async def test_an_announced_payload_other_than_the_policys_is_refused_and_not_loaded(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica of an adapter policy that finds model weights announced (or the reverse:
    a spec that says merged sync while the trainer sends adapters) would put one where the
    other goes: the sync fails, counted, and the engine keeps what it had."""
    from polyrl.workers.rollout.weights import EngineWeights

    names = JobNames(namespace="t", job=f"sp{uuid.uuid4().hex[:6]}")
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, list(POLICIES))
    model, _ = models.make_model(ModelSource(path=MODEL), cache_dir=tmp_path / "m")
    base = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    solver_store = await WeightStore.open(nc.jetstream(), names.weights_bucket("solver"))
    await WeightPublisher(solver_store, names, "solver", keyframe_every=4).publish(base)
    verifier = await publish_policy(
        nc.jetstream(), names, "verifier", base, adapter_state(1, model)
    )
    engine = engines.make_engine("torch", model)
    before = {k: v.clone() for k, v in engine.weights().items()}
    cases = [  # (policy, its store, the alpha the replica was told: None means model weights)
        ("solver", solver_store, 16),  # expects adapters, finds a model
        ("verifier", verifier.store, None),  # expects a model, finds adapters
    ]
    for policy, store, alpha in cases:
        weights = EngineWeights(nc.jetstream(), names, policy, store, adapter_alpha=alpha)
        assert await weights.update(engine) is None, policy
        assert (weights.version, weights.failures) == (None, 1), policy
    assert "holds model weights, the policy sends adapters" in caplog.text
    assert "holds an adapter, the policy sends model weights" in caplog.text
    assert all(torch.equal(engine.weights()[k], v) for k, v in before.items())
    for store in (solver_store, verifier.store):
        await store.close()
    await nc.close()
