"""The rollout worker: serves a policy's generation requests with an engine, drains on demand.

Every replica of a policy, in every PolicyGroup and region, pulls from the same JetStream
work queue when it has capacity, so a new replica takes work at once and a draining one
just stops pulling. A request is acked only after its response went out: a replica that
dies mid-request loses nothing, JetStream redelivers it. Up to `maxBatchSize` sequences are
generated together. Between batches the worker applies new weights (`WeightSource`), so it
never serves while weights change and never serves weights that failed verification.
Malformed requests are dead-lettered and terminated, never retried forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import nats
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from polyrl.api.messages import DrainAck, Drained, DrainRequest, WorkerState
from polyrl.api.wire import Completion, GenerationRequest, GenerationResponse
from polyrl.workers.rollout.engines.base import Engine, SamplingParams
from polyrl.workers.runtime import outage
from polyrl.workers.runtime.worker import Runtime

log = logging.getLogger("polyrl.rollout")
QUEUE_DEPTH_SECONDS = 2.0


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


class RolloutWorker:
    def __init__(
        self,
        rt: Runtime,
        engine: Engine,
        tokenizer: Tokenizer,
        weights: WeightSource | None = None,
        *,
        model: ModelFacts | None = None,
    ) -> None:
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
        sub = await self.rt.js.pull_subscribe(
            names.requests_subject(self.policy),
            durable=names.rollout_consumer,
            stream=names.requests_stream(self.policy),
        )
        await self.rt.enter(WorkerState.SERVING)
        started = time.monotonic()
        try:
            while not (self.draining.is_set() or self.rt.stopping.is_set()):
                await outage.retry(lambda: self._round(sub), what="serving requests")
                self._figures(time.monotonic() - started)
            await self._finish_drain()
        finally:
            await sub.unsubscribe()
            if self.weights is not None:
                await self.weights.close()

    async def _round(self, sub: Any) -> None:
        """Newer weights if announced, then a batch of requests served. In a NATS outage a
        round fails and is tried again (`outage`): what it fetched and did not answer is
        not acknowledged, so it is delivered again, here or to another replica."""
        await self._refresh_weights()
        await self._read_queue_depth(sub)
        batch = await self._fetch(sub)
        if batch:
            await self._serve(batch)

    async def _fetch(self, sub: Any) -> list[Pending]:
        try:
            msgs = await sub.fetch(self.max_batch, timeout=0.5)
        except (TimeoutError, nats.errors.TimeoutError, NotFoundError):
            return []
        batch = []
        for msg in msgs:
            pending = await self._parse(msg)
            if pending is not None:
                batch.append(pending)
        return batch

    async def _parse(self, msg: Msg) -> Pending | None:
        try:
            request = GenerationRequest.model_validate_json(msg.data)
        except ValidationError as err:
            await self.rt.dead_letter(msg.subject, msg.data, f"malformed request: {err}")
            await msg.term()
            return None
        if request.min_version > self.engine.version:
            await msg.nak(delay=0.2)  # newer weights are on their way (`staleness`, `rounds`)
            return None
        refusal = self._refusal(request)
        if refusal is not None:
            log.warning("request %s refused: %s", request.id, refusal)
            await self._answer(request, GenerationResponse(id=request.id, pod=self.rt.pod,
                weight_version=self.engine.version, prompt_tokens=request.prompt_tokens,
                error=refusal))  # fmt: skip
            await msg.term()  # no replica can serve it: never redeliver
            return None
        return Pending(msg=msg, request=request, prompt=request.prompt_tokens)

    def _refusal(self, request: GenerationRequest) -> str | None:
        """Why the request's ids cannot be served by this model (the runner encoded them with
        the policy's tokenizer, so this is a bug or a foreign id, never routine); else None."""
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
            for (temperature, max_new), group in _by_params(batch).items():
                prompts = [p.prompt for p in group for _ in range(p.request.n)]
                params = SamplingParams(
                    max_new_tokens=max_new, temperature=temperature, stop_token_ids=self._stops()
                )
                outputs = await asyncio.to_thread(self.engine.generate, prompts, params)
                await self._reply(group, outputs)
        finally:
            self.in_flight = 0
            self.busy += time.monotonic() - started

    def _stops(self) -> tuple[int, ...]:
        return self.stop_ids

    async def _reply(self, group: list[Pending], outputs: list[Any]) -> None:
        i = 0
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
            response = GenerationResponse(
                id=pending.request.id,
                pod=self.rt.pod,
                weight_version=self.engine.version,
                prompt_tokens=pending.prompt,
                completions=completions,
            )
            await self._answer(pending.request, response)
            await pending.msg.ack()  # only now: a crash before this means redelivery
            self.served += 1
            self.tokens += sum(len(c.tokens) for c in completions)

    async def _answer(self, request: GenerationRequest, response: GenerationResponse) -> None:
        await self.rt.nc.publish(request.reply_to, response.model_dump_json().encode())
        await self.rt.nc.flush()

    async def _refresh_weights(self) -> None:
        if self.weights is None:
            return
        version = await self.weights.update(self.engine)
        if version is not None:
            sync = self.weights.figures()
            log.info(
                "serving weight version %d (synced in %.3fs, %s bytes, %s of the weights changed)",
                version, sync.get("sync_seconds") or 0.0, sync.get("sync_bytes"),
                _percent(sync.get("changed_fraction")),
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

    async def _read_queue_depth(self, sub: Any) -> None:
        """Requests waiting for any replica (the consumer's pending count, what an
        autoscaler scales on), read once per heartbeat period, not per fetch."""
        now = time.monotonic()
        if now - self.depth_read < QUEUE_DEPTH_SECONDS:
            return
        self.depth_read = now
        with contextlib.suppress(Exception):  # a figure, not worth failing a fetch for
            self.queue_depth = (await sub.consumer_info()).num_pending

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


def _by_params(batch: list[Pending]) -> dict[tuple[float, int], list[Pending]]:
    groups: dict[tuple[float, int], list[Pending]] = {}
    for pending in batch:
        key = (pending.request.temperature, pending.request.max_new_tokens)
        groups.setdefault(key, []).append(pending)
    return groups


def _percent(fraction: float | int | None) -> str:
    """A share for the log: 0.0123 -> '1.23%', None (a keyframe) -> 'all'."""
    return "all" if fraction is None else f"{100 * fraction:.3g}%"
