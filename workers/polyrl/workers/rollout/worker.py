"""The rollout worker: serves a policy's generation requests with an engine, drains on demand.

Every replica of a policy, in every PolicyGroup and region, pulls from the same JetStream
work queue when it has capacity, so a new replica takes work at once and a draining one
just stops pulling. A request is acked only after its response went out: a replica that
dies mid-request loses nothing, JetStream redelivers it. Up to `maxBatchSize` sequences are
generated together. Between batches the worker applies new weights (`WeightSource`), so it
never serves while weights change and never serves weights that failed verification.
Malformed requests are dead-lettered and terminated, never retried forever.

A shared pool (`rollout.servedBy`) serves several LoRA policies on one base: the worker pulls
from each policy's queue (the one first in turn rotates every round, so a busy policy cannot
starve a quiet one), follows each policy's weights, and generates each policy's requests with
its own adapter (`ServesAdapters.select_adapter`). Heartbeats carry the figures per policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import nats
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from polyrl.api.messages import DrainAck, Drained, DrainRequest, PoolShare, WorkerState
from polyrl.api.wire import Completion, GenerationRequest, GenerationResponse
from polyrl.workers.rollout.engines.base import (
    Engine,
    GeneratesAsync,
    SamplingParams,
    ServesAdapters,
)
from polyrl.workers.runtime import outage
from polyrl.workers.runtime.worker import Runtime

log = logging.getLogger("polyrl.rollout")
QUEUE_DEPTH_SECONDS = 2.0
LOOK_SECONDS = 0.05  # a shared pool's quick look into each queue before it waits on all
WAIT_SECONDS = 0.5  # how long a fetch waits for work to arrive
LINGER_SECONDS = 0.03  # how long a part-filled batch waits for more (requests come in bursts)
CATCH_UP_SECONDS = 0.05  # at most this often, a request for newer weights looks for them


class Tokenizer(Protocol):
    @property
    def eos_token_id(self) -> Any: ...

    def __len__(self) -> int: ...

    def decode(self, *args: Any, **kwargs: Any) -> Any: ...


class WeightSource(Protocol):
    """Where new weights come from (full or sparse, chosen by the policy's weightSync)."""

    async def update(self, engine: Engine) -> int | None:
        """Apply any newer weights to `engine`; the version now served, or None if unchanged."""
        ...

    async def close(self) -> None: ...

    @property
    def version(self) -> int | None:
        """The version now served; None before the first."""
        ...

    def figures(self) -> dict[str, float | int | None]:
        """The last weight sync's figures for the heartbeat (`Heartbeat.sync_seconds`, ...)."""
        ...


@dataclass(frozen=True)
class ModelFacts:
    """What the worker checks requests against and stops generation on, from the model's
    config, generation config and tokenizer (`rollout_main.build_rollout` reads them)."""

    stop_ids: tuple[int, ...]
    vocab_size: int
    context: int | None = None

    @classmethod
    def of(cls, tokenizer: Any) -> ModelFacts:
        """From the tokenizer alone (tests' tiny models): its EOS, its length, no context."""
        eos = tokenizer.eos_token_id
        return cls((eos,) if eos is not None else (), len(tokenizer))


@dataclass
class Pending:
    msg: Msg
    request: GenerationRequest
    prompt: list[int]


@dataclass
class Queue:
    """One policy the worker serves: its requests' consumer, its weights, its figures."""

    policy: str
    weights: WeightSource | None
    sub: Any = None
    served: int = 0
    depth: int | None = None
    waits: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    looked: float = float("-inf")  # when a request for newer weights last had them looked for

    def share(self, version: int) -> PoolShare:
        waits = sorted(self.waits)
        return PoolShare(
            requests_served=self.served,
            weight_version=version,
            queue_depth=self.depth,
            queue_seconds_p50=round(statistics.median(waits), 4) if waits else None,
            queue_seconds_p95=round(waits[int(0.95 * (len(waits) - 1))], 4) if waits else None,
        )


class RolloutWorker:
    def __init__(
        self,
        rt: Runtime,
        engine: Engine,
        tokenizer: Tokenizer,
        weights: WeightSource | None = None,
        *,
        model: ModelFacts | None = None,
        pool: Mapping[str, WeightSource] | None = None,
    ) -> None:
        """`pool`: the other policies a shared pool serves, with their weights."""
        self.rt = rt
        self.engine = engine
        self.tokenizer = tokenizer
        facts = model or ModelFacts.of(tokenizer)
        self.stop_ids, self.vocab_size, self.context = (
            facts.stop_ids,
            facts.vocab_size,
            facts.context,
        )
        self.weights = weights
        self.policy = rt.config.policy or ""
        self.queues = {self.policy: Queue(self.policy, weights)} | {
            policy: Queue(policy, source) for policy, source in (pool or {}).items()
        }
        self.rounds = 0
        self.max_batch = self._max_batch()
        self.draining = asyncio.Event()
        self.served = 0
        self.in_flight = 0
        self.tokens = 0
        self.busy = 0.0  # seconds spent generating
        self.queue_depth: int | None = None
        self.depth_read = -QUEUE_DEPTH_SECONDS

    def _max_batch(self) -> int:
        policy = self.rt.config.spec.policy(self.policy)
        return policy.rollout.max_batch_size if policy else 32

    async def run(self) -> None:
        names = self.rt.names
        await self.rt.nc.subscribe(names.drain_subject(self.policy, self.rt.pod), cb=self._on_drain)
        for queue in self.queues.values():
            queue.sub = await self.rt.js.pull_subscribe(
                names.requests_subject(queue.policy),
                durable=names.rollout_consumer,
                stream=names.requests_stream(queue.policy),
            )
        await self.rt.enter(WorkerState.SERVING)
        started = time.monotonic()
        try:
            while not (self.draining.is_set() or self.rt.stopping.is_set()):
                await outage.retry(self._round, what="serving requests")
                self._figures(time.monotonic() - started)
            await self._finish_drain()
        finally:
            for queue in self.queues.values():
                await queue.sub.unsubscribe()
                if queue.weights is not None:
                    await queue.weights.close()

    async def _round(self) -> None:
        """Newer weights if announced, then a batch of requests served. In a NATS outage a
        round fails and is tried again (`outage`): what it fetched and did not answer is
        not acknowledged, so it is delivered again, here or to another replica."""
        await self._refresh_weights()
        await self._read_queue_depth()
        batch = await self._fetch()
        if batch:
            await self._serve(batch)

    async def _fetch(self) -> list[Pending]:
        """Up to `max_batch` requests. One queue: wait on it. A shared pool: a quick look
        into each queue in turn, the first one in turn rotating every round, until the batch
        is full; if all were empty, wait on all of them at once."""
        queues = list(self.queues.values())
        if len(queues) == 1:
            return await self._fill(queues[0])
        self.rounds += 1
        turn = self.rounds % len(queues)
        batch: list[Pending] = []
        for queue in queues[turn:] + queues[:turn]:
            if len(batch) < self.max_batch:
                batch += await self._pull(queue, self.max_batch - len(batch), LOOK_SECONDS)
        if batch:
            return batch
        share = max(1, self.max_batch // len(queues))
        waited = await asyncio.gather(*(self._pull(q, share, WAIT_SECONDS) for q in queues))
        return [pending for got in waited for pending in got]

    async def _fill(self, queue: Queue) -> list[Pending]:
        """One queue's batch. A round's requests (sync mode) or a burst of episodes arrive
        over a few milliseconds: served as they come, the first comer would be generated
        alone and the rest after it, twice the time for engines that batch (seen in
        `polyrl bench pipeline --simulated`'s sync rounds). So a part-filled batch waits
        LINGER_SECONDS for more."""
        batch = await self._pull(queue, self.max_batch, WAIT_SECONDS)
        if batch and len(batch) < self.max_batch:
            batch += await self._pull(queue, self.max_batch - len(batch), LINGER_SECONDS)
        return batch

    async def _pull(self, queue: Queue, room: int, timeout: float) -> list[Pending]:
        try:
            msgs = await queue.sub.fetch(room, timeout=timeout)
        except (TimeoutError, nats.errors.TimeoutError, NotFoundError):
            return []
        batch = []
        now = time.time()
        for msg in msgs:
            with contextlib.suppress(Exception):  # a figure: a message without metadata
                queue.waits.append(max(0.0, now - msg.metadata.timestamp.timestamp()))
            pending = await self._parse(msg, queue)
            if pending is not None:
                batch.append(pending)
        return batch

    async def _parse(self, msg: Msg, queue: Queue) -> Pending | None:
        try:
            request = GenerationRequest.model_validate_json(msg.data)
        except ValidationError as err:
            await self.rt.dead_letter(msg.subject, msg.data, f"malformed request: {err}")
            await msg.term()
            return None
        version = self._version(queue.policy)
        if version is None or request.min_version > version:
            version = await self._catch_up(queue)
        if version is None or request.min_version > version:
            await msg.nak(delay=0.2)  # newer weights are on their way (`staleness`, `rounds`)
            return None
        refusal = self._refusal(request, queue.policy)
        if refusal is not None:
            log.warning("request %s refused: %s", request.id, refusal)
            await self._answer(request, GenerationResponse(id=request.id, pod=self.rt.pod,
                weight_version=version, prompt_tokens=request.prompt_tokens,
                error=refusal))  # fmt: skip
            await msg.term()  # no replica can serve it: never redeliver
            return None
        return Pending(msg=msg, request=request, prompt=request.prompt_tokens)

    async def _catch_up(self, queue: Queue) -> int | None:
        """The version served after taking newer weights now, if they are announced: sync
        mode's rounds ask for a version right after announcing it, and a request held back
        until the next round's refresh cost each sync step its nak delay and up to a fetch's
        wait. Between batches, as every refresh; looked for at most every CATCH_UP_SECONDS
        (a request for a version still being published must not cost a lookup each)."""
        now = time.monotonic()
        if queue.weights is not None and now - queue.looked >= CATCH_UP_SECONDS:
            queue.looked = now
            await self._refresh_weights()
        return self._version(queue.policy)

    def _version(self, policy: str) -> int | None:
        """The weight version `policy` is served with: the engine's for the worker's own
        policy (None never: it started with weights), its source's for a pool's others."""
        if policy == self.policy:
            return self.engine.version
        source = self.queues[policy].weights
        return source.version if source is not None else None

    def _refusal(self, request: GenerationRequest, policy: str) -> str | None:
        """Why the request cannot be served here: asked of another policy than its queue's
        (a shared pool's queues must not mix), or ids this model cannot take (the runner
        encoded them with the policy's tokenizer, so a bug or a foreign id, never routine);
        else None."""
        if request.policy != policy:
            return f"a request for policy {request.policy!r} in policy {policy}'s queue"
        ids = request.prompt_tokens
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            return f"prompt token ids outside the model's vocabulary [0, {self.vocab_size})"
        if self.context is not None and len(ids) + request.max_new_tokens > self.context:
            return (
                f"{len(ids)} prompt tokens and up to {request.max_new_tokens} new ones exceed "
                f"the model's context of {self.context}"
            )
        return None

    async def _serve(self, batch: list[Pending]) -> None:
        self.in_flight = len(batch)
        self.rt.figures["in_flight"] = self.in_flight  # heartbeats may be sent meanwhile
        started = time.monotonic()
        try:
            for (policy, temperature, max_new), group in _by_params(batch).items():
                prompts = [p.prompt for p in group for _ in range(p.request.n)]
                params = SamplingParams(
                    max_new_tokens=max_new, temperature=temperature, stop_token_ids=self._stops()
                )
                if isinstance(self.engine, GeneratesAsync):  # waits, computes nothing
                    outputs = await self.engine.agenerate(prompts, params)
                else:
                    outputs = await asyncio.to_thread(self._generate, policy, prompts, params)
                await self._reply(group, outputs)
        finally:
            self.in_flight = 0
            self.busy += time.monotonic() - started

    def _generate(self, policy: str, prompts: list[list[int]], params: SamplingParams) -> Any:
        """On a thread: a shared pool's engine switches to the policy's adapter first."""
        if len(self.queues) > 1:
            assert isinstance(self.engine, ServesAdapters)
            self.engine.select_adapter(policy)
        return self.engine.generate(prompts, params)

    def _stops(self) -> tuple[int, ...]:
        return self.stop_ids

    async def _reply(self, group: list[Pending], outputs: list[Any]) -> None:
        """Every response out, then one flush for the batch (a round trip per response cost
        a fleet's replicas a tenth of their time: `polyrl bench scale`), then the acks."""
        responses = self._responses(group, outputs)
        for pending, response in zip(group, responses, strict=True):
            await self.rt.nc.publish(pending.request.reply_to, response.model_dump_json().encode())
        await self.rt.nc.flush()
        for pending, response in zip(group, responses, strict=True):
            await pending.msg.ack()  # only now: a crash before this means redelivery
            self.served += 1
            self.queues[pending.request.policy].served += 1
            self.tokens += sum(len(c.tokens) for c in response.completions)

    def _responses(self, group: list[Pending], outputs: list[Any]) -> list[GenerationResponse]:
        responses, i = [], 0
        for pending in group:
            mine, i = outputs[i : i + pending.request.n], i + pending.request.n
            completions = [
                Completion(
                    tokens=g.tokens,
                    logprobs=g.logprobs,
                    text=self.tokenizer.decode(g.tokens, skip_special_tokens=True),
                    finish_reason=g.finish_reason,
                )
                for g in mine
            ]
            responses.append(GenerationResponse(
                id=pending.request.id,
                pod=self.rt.pod,
                weight_version=self._version(pending.request.policy) or 0,
                prompt_tokens=pending.prompt,
                completions=completions,
            ))  # fmt: skip
        return responses

    async def _answer(self, request: GenerationRequest, response: GenerationResponse) -> None:
        await self.rt.nc.publish(request.reply_to, response.model_dump_json().encode())
        await self.rt.nc.flush()

    async def _refresh_weights(self) -> None:
        for queue in self.queues.values():
            if queue.weights is None:
                continue
            version = await queue.weights.update(self.engine)
            if version is not None:
                sync = queue.weights.figures()
                # A shared pool names the other policies it serves; the own one as ever.
                whose = "" if queue.policy == self.policy else f"{queue.policy} "
                log.info(
                    "serving %sweight version %d (synced in %.3fs, %s bytes, %s of the "
                    "weights changed)", whose, version, sync.get("sync_seconds") or 0.0,
                    sync.get("sync_bytes"), _percent(sync.get("changed_fraction")),
                )  # fmt: skip

    def _figures(self, elapsed: float) -> None:
        self.rt.figures = {
            "weight_version": self.engine.version,
            "requests_served": self.served,
            "in_flight": self.in_flight,
            "tokens_per_second": self.tokens / elapsed if elapsed > 0 else 0.0,
            "idle_fraction": max(0.0, 1 - self.busy / elapsed) if elapsed > 0 else None,
            "queue_depth": self.queue_depth,
            **(self.weights.figures() if self.weights is not None else {}),
        }
        if len(self.queues) > 1:
            self.rt.figures["pool"] = {
                q.policy: q.share(self._version(q.policy) or 0) for q in self.queues.values()
            }

    async def _read_queue_depth(self) -> None:
        """Requests waiting for any replica (the consumers' pending counts, what an
        autoscaler scales on), read once per heartbeat period, not per fetch."""
        now = time.monotonic()
        if now - self.depth_read < QUEUE_DEPTH_SECONDS:
            return
        self.depth_read = now
        for queue in self.queues.values():
            with contextlib.suppress(Exception):  # a figure, not worth failing a fetch for
                queue.depth = (await queue.sub.consumer_info()).num_pending
        depths = [q.depth for q in self.queues.values() if q.depth is not None]
        self.queue_depth = sum(depths) if depths else None

    async def _on_drain(self, msg: Msg) -> None:
        try:
            DrainRequest.model_validate_json(msg.data)
        except ValidationError as err:
            await self.rt.dead_letter(msg.subject, msg.data, f"malformed drain request: {err}")
            return
        self.rt.state = WorkerState.DRAINING
        await msg.respond(
            DrainAck(pod=self.rt.pod, in_flight=self.in_flight).model_dump_json().encode()
        )
        if self.draining.is_set() and self.in_flight == 0:
            await self._announce_drained()  # asked again after we finished: say it again
        self.draining.set()

    async def _finish_drain(self) -> None:
        if not self.draining.is_set():
            return
        self.rt.state = WorkerState.DRAINED
        await self._announce_drained()

    async def _announce_drained(self) -> None:
        drained = Drained(pod=self.rt.pod, served=self.served, at=time.time())
        with contextlib.suppress(Exception):
            await self.rt.nc.publish(
                self.rt.names.drained_subject(self.policy, self.rt.pod),
                drained.model_dump_json().encode(),
            )
            await self.rt.nc.flush()


def _by_params(batch: list[Pending]) -> dict[tuple[str, float, int], list[Pending]]:
    groups: dict[tuple[str, float, int], list[Pending]] = {}
    for pending in batch:
        request = pending.request
        key = (request.policy, request.temperature, request.max_new_tokens)
        groups.setdefault(key, []).append(pending)
    return groups


def _percent(fraction: float | int | None) -> str:
    """A share for the log: 0.0123 -> '1.23%', None (a keyframe) -> 'all'."""
    return "all" if fraction is None else f"{100 * fraction:.3g}%"
