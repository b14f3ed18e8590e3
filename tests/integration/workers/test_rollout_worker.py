"""A real rollout worker: bundle and weights from NATS, requests served, updates, drain.

The test plays the trainer's publishing part (model bundle, then weight versions through
the weight-delta publisher) and talks to the worker only through NATS.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import nats
import pytest
import torch
from nats.aio.client import Client as NatsClient
from tests import fuzzing

from polyrl.api import natsconfig
from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.messages import DrainAck, Drained, DrainRequest, Heartbeat, WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.resources import ModelSource, RLJobSpec
from polyrl.api.wire import DeadLetter, GenerationRequest, GenerationResponse
from polyrl.local.natsserver import NatsServer
from polyrl.testing.waiting import wait_until_async
from polyrl.workers.models import loading as models
from polyrl.workers.models.chartokenizer import build_tokenizer
from polyrl.workers.rollout import main as rollout_main
from polyrl.workers.rollout.worker import RolloutWorker
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.weightsync import bundle
from polyrl.workers.weightsync.announce import WeightAnnouncement
from polyrl.workers.weightsync.publish import WeightPublisher
from polyrl.workers.weightsync.store import WeightStore

pytestmark = pytest.mark.slow
CHARS = build_tokenizer()  # the tiny Llama's: requests carry its ids


class Trainer:
    """Publishes like the trainer does: bundle once, then one weight version per call."""

    def __init__(self, js: object, names: JobNames, tmp: Path) -> None:
        self.model, self.tokenizer = models.make_model(
            ModelSource(path="tiny-llama://rollout-test", dtype="float32"), cache_dir=tmp / "m"
        )
        self.js, self.names, self.tmp = js, names, tmp

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to(torch.bfloat16) for k, v in self.model.state_dict().items()}

    async def start(self) -> WeightPublisher:
        export = self.tmp / "export"
        models.export(self.model, self.tokenizer, export)
        await bundle.publish(self.js, self.names, "solver", export)  # type: ignore[arg-type]
        store = await WeightStore.open(self.js, self.names.weights_bucket("solver"))  # type: ignore[arg-type]
        publisher = WeightPublisher(store, self.names, "solver", keyframe_every=4)
        await publisher.publish(self.state())
        return publisher


@pytest.fixture
async def setup(
    nats_server: NatsServer, tmp_path: Path
) -> AsyncIterator[
    tuple[NatsClient, JobNames, Trainer, WeightPublisher, RolloutWorker, asyncio.Task[None]]
]:
    names = JobNames(namespace="t", job=f"rw{uuid.uuid4().hex[:6]}")
    spec = RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://rollout-test"},
                    "rollout": {"maxBatchSize": 8},
                }
            ]
        }
    )
    config = WorkerConfig(
        namespace="t",
        job=names.job,
        role=Role.ROLLOUT,
        policy="solver",
        policy_group=f"{names.job}-solver",
        nats_url=nats_server.url,
        spec=spec,
    )
    nc = await nats.connect(nats_server.url)
    await natsconfig.ensure(nc.jetstream(), names, ["solver"])
    trainer = Trainer(nc.jetstream(), names, tmp_path)
    publisher = await trainer.start()
    rt = await Runtime.connect(config, "rollout-0")
    worker = await rollout_main.build_rollout(rt, bundle_timeout=30)
    task = asyncio.create_task(worker.run())
    # Serving: subscribed to its drain subject and its queue.
    await wait_until_async("the worker serving", lambda: rt.state == WorkerState.SERVING)
    yield nc, names, trainer, publisher, worker, task
    rt.stopping.set()
    await asyncio.wait_for(task, timeout=30)
    await publisher.store.close()
    await rt.close()
    await nc.close()


async def ask(
    nc: NatsClient,
    names: JobNames,
    prompts: Sequence[str | list[int]],
    n: int = 2,
    temperature: float = 1.0,
) -> list[GenerationResponse]:
    inbox = f"test.{uuid.uuid4().hex}"
    sub = await nc.subscribe(inbox)
    for i, prompt in enumerate(prompts):
        rid = f"{inbox}-{i}"
        request = GenerationRequest(
            id=rid,
            episode_id=rid,
            policy="solver",
            prompt_tokens=CHARS(prompt)["input_ids"] if isinstance(prompt, str) else prompt,
            n=n,
            max_new_tokens=6,
            temperature=temperature,
            reply_to=inbox,
        )
        await nc.jetstream().publish(
            names.requests_subject("solver"),
            request.model_dump_json().encode(),
            headers={"Nats-Msg-Id": rid},
        )
    replies = [
        GenerationResponse.model_validate_json((await sub.next_msg(timeout=60)).data)
        for _ in prompts
    ]
    await sub.unsubscribe()
    return sorted(replies, key=lambda r: r.id)


async def test_requests_are_answered_with_completions_logprobs_and_the_weight_version(
    setup: Any,
) -> None:
    nc, names, _, _, worker, _ = setup
    replies = await ask(nc, names, ["12+35=", "7+8=", "40+2="])
    assert [len(r.completions) for r in replies] == [2, 2, 2]
    for reply in replies:
        assert reply.pod == "rollout-0"
        assert reply.weight_version == 0
        assert reply.prompt_tokens
        for completion in reply.completions:
            assert 1 <= len(completion.tokens) <= 6
            assert len(completion.logprobs) == len(completion.tokens)
            assert all(lp <= 0.0 for lp in completion.logprobs)
    # The worker counts a request once it is acked, which is after the reply we just read.
    await wait_until_async("3 requests served", lambda: worker.served >= 3, timeout=5)
    assert worker.served == 3


async def test_new_weights_are_applied_bit_identically_between_batches(setup: Any) -> None:
    nc, names, trainer, publisher, worker, _ = setup
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    await publisher.publish(trainer.state())

    async def answers_from_version_1() -> bool:
        return (await ask(nc, names, ["1+1="], n=1))[0].weight_version == 1

    await wait_until_async("a reply from weight version 1", answers_from_version_1, timeout=60)
    served = worker.engine.weights()
    for name, tensor in trainer.state().items():
        assert torch.equal(served[name].view(torch.int16), tensor.view(torch.int16)), name


async def test_a_malformed_request_is_dead_lettered_and_the_worker_keeps_serving(
    setup: Any,
) -> None:
    nc, names, _, _, worker, _ = setup
    dlq = await nc.jetstream().subscribe(names.dead_letter_subject)
    await nc.jetstream().publish(
        names.requests_subject("solver"), b"{not json", headers={"Nats-Msg-Id": uuid.uuid4().hex}
    )
    letter = DeadLetter.model_validate_json((await dlq.next_msg(timeout=30)).data)
    assert letter.worker == "rollout-0"
    assert "malformed request" in letter.error
    assert (await ask(nc, names, ["2+2="], n=1))[0].completions
    assert worker.rt.dead_letters == 1


async def test_ids_its_model_cannot_take_are_refused_with_the_cause_and_serving_goes_on(
    setup: Any,
) -> None:
    nc, names, _, _, worker, _ = setup
    assert worker.context == 128
    assert worker.stop_ids == (CHARS.eos_token_id,)
    foreign, long = [1, len(CHARS) + 5], [1] + [5] * 125  # 126 + 6 new > the context of 128
    refused = await ask(nc, names, [foreign, long, "3+4="], n=1)
    assert "outside the model's vocabulary" in (refused[0].error or "")
    assert "exceed the model's context of 128" in (refused[1].error or "")
    assert not refused[0].completions
    assert not refused[1].completions
    assert refused[2].error is None
    assert refused[2].completions


async def test_a_drain_request_is_acked_then_answered_with_drained(setup: Any) -> None:
    nc, names, _, _, worker, task = setup
    drained = await nc.subscribe(names.drained_subject("solver", "rollout-0"))
    reply = await nc.request(
        names.drain_subject("solver", "rollout-0"),
        DrainRequest(pod="rollout-0", timeout_seconds=10).model_dump_json().encode(),
        timeout=10,
    )
    assert DrainAck.model_validate_json(reply.data).pod == "rollout-0"
    message = Drained.model_validate_json((await drained.next_msg(timeout=30)).data)
    assert message.pod == "rollout-0"
    await asyncio.wait_for(task, timeout=30)  # it stopped pulling and returned
    assert json.loads(message.model_dump_json())["served"] == worker.served


async def test_fuzzed_requests_are_dead_lettered_exactly_when_malformed_and_serving_goes_on(
    setup: Any,
) -> None:
    nc, names, _, _, worker, task = setup
    valid = GenerationRequest(
        id="fuzz",
        episode_id="fuzz",
        policy="solver",
        prompt_tokens=CHARS("1+1=")["input_ids"],
        n=1,
        max_new_tokens=2,
        reply_to=f"test.fuzz.{uuid.uuid4().hex}",
    ).model_dump(mode="json")
    messages = fuzzing.examples(fuzzing.mutants(valid), 400)
    assert len(messages) >= 300
    expected = sum(fuzzing.malformed(GenerationRequest, m) for m in messages)
    assert expected >= len(messages) // 2  # the mutants are mostly broken, not mostly valid
    for message in messages:
        await nc.jetstream().publish(
            names.requests_subject("solver"), message, headers={"Nats-Msg-Id": uuid.uuid4().hex}
        )
    await wait_until_async(
        f"{expected} dead letters", lambda: worker.rt.dead_letters >= expected, timeout=60
    )
    assert worker.rt.dead_letters == expected
    assert not task.done()
    assert (await ask(nc, names, ["2+2="], n=1))[0].completions  # still serving
    await worker.rt.beat()  # the count reaches the heartbeat, where status is made from
    kv = await nc.jetstream().key_value(names.heartbeats_bucket)
    entry = await kv.get(JobNames.heartbeat_key("solver", "rollout", "rollout-0"))
    assert Heartbeat.model_validate_json(entry.value or b"").dead_letters == expected


async def test_fuzzed_announcements_are_dead_lettered_once_and_the_replica_keeps_its_weights(
    setup: Any,
) -> None:
    """A writer that is not the trainer puts junk on the weights subject: the replica passes
    over it to the newest well-formed announcement (or keeps what it serves), dead-letters
    each once, and follows the trainer's next version."""
    nc, names, trainer, publisher, worker, task = setup
    js = nc.jetstream()
    last = await js.get_last_msg(names.weights_stream("solver"), names.weights_subject("solver"))
    valid = WeightAnnouncement.model_validate_json(last.data or b"").model_dump(mode="json")
    messages = fuzzing.examples(fuzzing.mutants(valid), 150)
    bad = [m for m in messages if fuzzing.malformed(WeightAnnouncement, m)]
    assert len(bad) >= len(messages) // 3
    for start in range(0, len(bad), 40):  # within what the stream keeps of the subject
        chunk, before = bad[start : start + 40], worker.rt.dead_letters
        for message in chunk:
            await js.publish(names.weights_subject("solver"), message)
        await wait_until_async(
            f"{len(chunk)} more dead letters",
            lambda: worker.rt.dead_letters >= before + len(chunk),  # noqa: B023
        )
        assert worker.rt.dead_letters == before + len(chunk)
    assert not task.done()
    assert (await ask(nc, names, ["2+2="], n=1))[0].weight_version == 0
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    await publisher.publish(trainer.state())

    async def answers_from_version_1() -> bool:
        return (await ask(nc, names, ["1+1="], n=1))[0].weight_version == 1

    await wait_until_async("a reply from weight version 1", answers_from_version_1, timeout=60)
    assert worker.engine.version == 1
    assert worker.rt.dead_letters == len(bad)  # each once, however often it was read


async def test_fuzzed_drain_requests_are_dead_lettered_and_the_replica_keeps_serving(
    setup: Any,
) -> None:
    nc, names, _, _, worker, task = setup
    valid = DrainRequest(pod="rollout-0", timeout_seconds=10).model_dump(mode="json")
    bad = [
        m for m in fuzzing.examples(fuzzing.mutants(valid), 150)
        if fuzzing.malformed(DrainRequest, m)  # a well-formed one would drain it
    ]  # fmt: skip
    assert len(bad) >= 50
    for message in bad:
        await nc.publish(names.drain_subject("solver", "rollout-0"), message)
    await wait_until_async(f"{len(bad)} dead letters", lambda: worker.rt.dead_letters >= len(bad))
    assert worker.rt.dead_letters == len(bad)
    assert not task.done()
    assert not worker.draining.is_set()
    assert (await ask(nc, names, ["2+2="], n=1))[0].completions


async def test_a_trainer_evaluates_through_the_pool_at_its_version_and_hears_of_none_later(
    setup: Any, nats_server: NatsServer
) -> None:
    from polyrl.workers.models import prompts
    from polyrl.workers.tasks import base
    from polyrl.workers.trainer.pool_scoring import (
        EvaluationStopped,
        PoolScorer,
        PoolUnanswered,
    )

    nc, names, trainer, _, worker, _ = setup
    config = worker.rt.config.model_copy(update={"role": Role.TRAINER})
    rt = await Runtime.connect(config, "trainer-0")
    try:
        scorer = PoolScorer(
            rt=rt, policy="solver", tokenizer=prompts.for_training(trainer.tokenizer, "text"),
            max_new_tokens=6, answer_tokens=6, samples=3, temperature=1.0,
            loop=asyncio.get_running_loop(), request_timeout=60,
        )  # fmt: skip
        asked = ["12+35=", "7+8=", "40+2="]
        greedy = await asyncio.to_thread(scorer.greedy, asked)
        direct = [
            CHARS.decode(r.completions[0].tokens, skip_special_tokens=True)
            for r in await ask(nc, names, asked, n=1, temperature=0.0)
        ]
        assert greedy == direct  # the pool's greedy answers, in the order asked
        sampled = await asyncio.to_thread(scorer.sampled, asked, n=3)
        assert [len(row) for row in sampled] == [3, 3, 3]
        problems = [
            base.Problem(prompt=p, answer=g, id=p) for p, g in zip(asked, greedy, strict=True)
        ]
        right = await asyncio.to_thread(
            scorer.accuracy, problems, reward=lambda p, t: float(t == p.answer)
        )
        assert right == 1.0
        assert scorer.off_version == 0  # every answer from version 0, the one evaluated
        # A version the pool never gets: asked again under fresh ids, then a clear error.
        scorer.version, scorer.request_timeout, scorer.retries = 5, 1.0, 2
        with pytest.raises(PoolUnanswered, match="1 of 1 evaluation requests unanswered"):
            await asyncio.to_thread(scorer.greedy, ["1+1="])
        # A trainer told to stop does not wait out its timeout for a pool that is gone.
        scorer.request_timeout = 600.0
        asyncio.get_running_loop().call_later(0.5, rt.stopping.set)
        with pytest.raises(EvaluationStopped, match="evaluation stopped with the trainer"):
            await asyncio.wait_for(asyncio.to_thread(scorer.greedy, ["2+2="]), timeout=30)
    finally:
        await rt.close()
