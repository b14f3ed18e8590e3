"""A policy's rollout pool as evaluators see it (`trainer.evalOn: rollout`).

Held-out answers come from the engine that serves the policy, at the version being evaluated,
instead of greedy decoding on the trainer's rank 0: for a real model the pool's engine (vLLM,
or the torch engine's batched, cached decoding) is far faster than the trainer's generate, the
answers are the ones the deployed policy gives, and sampled answers for pass@k cost the pool
what they would cost in training.

The trainer asks between steps, after the version it evaluates has landed, and waits for every
answer before it trains again, so the pool cannot move past that version meanwhile; each reply
says which version served it, and any other is counted (`off_version`). Requests go to the
policy's own work queue beside the workflow's, with a reply subject of the trainer's own
(`JobNames.eval_replies_subject`). The evaluator's calls are synchronous and run in a worker
thread (`Leader.evaluate`); each one is handed to the leader's event loop, where NATS lives.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg

from polyrl.api.wire import GenerationRequest, GenerationResponse
from polyrl.workers.models.prompts import ids_for
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.tasks import base

log = logging.getLogger("polyrl.trainer")

Prompt = str | Sequence[Mapping[str, str]]


class PoolUnanswered(RuntimeError):
    """The rollout pool left evaluation requests unanswered after every retry."""


class EvaluationStopped(RuntimeError):
    """The trainer is stopping: an evaluation in progress gives up (its figures are lost)."""


@dataclass
class PoolScorer:
    """Greedy and sampled answers from the policy's rollout pool (`workflows.interface.Scorer`
    and `SamplingScorer`)."""

    rt: Runtime
    policy: str
    tokenizer: Any
    """The trainer's tokenizer as prompts are encoded for training (`prompts.for_training`)."""
    max_new_tokens: int
    answer_tokens: int
    samples: int
    """k of pass@k: sampled completions per problem (0: greedy only)."""
    temperature: float
    loop: asyncio.AbstractEventLoop
    request_timeout: float = 300.0
    retries: int = 3
    version: int = 0
    """The version being evaluated: requests ask for at least it (`min_version`)."""
    off_version: int = 0
    """Replies served at another version than `version`, since the last `take_counts`."""
    _waiting: dict[str, asyncio.Future[GenerationResponse]] = field(default_factory=dict)
    _ids: Any = field(default_factory=itertools.count)
    _boot: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    _listening: bool = False

    def greedy(self, prompts: Sequence[Prompt], *, max_new_tokens: int | None = None) -> list[str]:
        """Greedy completions of `prompts`, in the policy's budget unless told otherwise."""
        budget = max_new_tokens or self.max_new_tokens
        replies = self._ask(prompts, n=1, temperature=0.0, max_new_tokens=budget)
        return [reply[0] for reply in replies]

    def sampled(
        self, prompts: Sequence[Prompt], *, n: int, max_new_tokens: int | None = None
    ) -> list[list[str]]:
        """`n` completions of each prompt at the policy's sampling temperature."""
        budget = max_new_tokens or self.max_new_tokens
        return self._ask(prompts, n=n, temperature=self.temperature, max_new_tokens=budget)

    def accuracy(
        self,
        problems: Sequence[base.Problem],
        *,
        reward: Callable[[base.Problem, str], float],
        max_new_tokens: int | None = None,
    ) -> float:
        """The mean `reward` of greedy completions of `problems`."""
        if not problems:
            raise ValueError("accuracy needs at least one problem")
        texts = self.greedy([p.request for p in problems], max_new_tokens=max_new_tokens)
        return sum(reward(p, t) for p, t in zip(problems, texts, strict=True)) / len(problems)

    def _ask(
        self, prompts: Sequence[Prompt], *, n: int, temperature: float, max_new_tokens: int
    ) -> list[list[str]]:
        """Run `ask` on the leader's loop from this (worker) thread."""
        ids = [ids_for(self.tokenizer, p) for p in prompts]
        coro = self.ask(ids, n=n, temperature=temperature, max_new_tokens=max_new_tokens)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def ask(
        self, prompts: Sequence[list[int]], *, n: int, temperature: float, max_new_tokens: int
    ) -> list[list[str]]:
        """Each prompt's `n` completion texts, in order. Requests left unanswered once the pool
        has gone quiet for `request_timeout` s are sent again under fresh ids (the work queue
        de-duplicates by id), up to `retries` times."""
        await self._listen()
        answers: dict[int, list[str]] = {}
        for attempt in range(self.retries):
            missing = [i for i in range(len(prompts)) if i not in answers]
            if not missing:
                break
            if attempt:
                log.info("%d evaluation requests unanswered; asking again", len(missing))
            got = await self._round(
                {i: prompts[i] for i in missing}, n, temperature, max_new_tokens
            )
            answers |= got
        if len(answers) < len(prompts):
            raise PoolUnanswered(
                f"policy {self.policy!r}: {len(prompts) - len(answers)} of {len(prompts)} "
                f"evaluation requests unanswered after {self.retries} tries, each ended by "
                f"{self.request_timeout:.0f} s without an answer (is the rollout pool serving?)"
            )
        return [answers[i] for i in range(len(prompts))]

    async def _round(
        self, prompts: Mapping[int, list[int]], n: int, temperature: float, max_new: int
    ) -> dict[int, list[str]]:
        """One request per prompt; the answers that came within the timeout, by index."""
        loop = asyncio.get_running_loop()
        futures: dict[int, asyncio.Future[GenerationResponse]] = {}
        for i, ids in prompts.items():
            rid = f"eval-{self.policy}-{self._boot}-{next(self._ids)}"
            futures[i] = self._waiting[rid] = loop.create_future()
            request = GenerationRequest(
                id=rid,
                episode_id=rid,
                policy=self.policy,
                prompt_tokens=ids,
                n=n,
                max_new_tokens=max_new,
                temperature=temperature,
                min_version=self.version,
                reply_to=self.rt.names.eval_replies_subject(self.policy),
            )
            await self.rt.js.publish(
                self.rt.names.requests_subject(self.policy),
                request.model_dump_json().encode(),
                headers={"Nats-Msg-Id": rid},
            )
        await self._wait(set(futures.values()))
        got: dict[int, list[str]] = {}
        for i, future in futures.items():
            if future.done():
                got[i] = self._texts(future.result())
            else:
                future.cancel()
        for rid in [r for r, f in self._waiting.items() if f.done()]:
            del self._waiting[rid]
        return got

    async def _wait(self, pending: set[asyncio.Future[GenerationResponse]]) -> None:
        """Until every answer is in, or none has come for `request_timeout` s (a slow pool
        that keeps answering is waited for: asking again would only queue duplicates), or
        the trainer is stopping (EvaluationStopped: a stopped pool never answers)."""
        stopping: asyncio.Future[Any] = asyncio.ensure_future(self.rt.stopping.wait())
        waiting: set[asyncio.Future[Any]] = set(pending)
        try:
            while waiting and not stopping.done():
                done, waiting = await asyncio.wait(
                    waiting | {stopping},
                    timeout=self.request_timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waiting.discard(stopping)
                if not done:
                    return  # no answer for request_timeout s
        finally:
            stopping.cancel()
        if self.rt.stopping.is_set():
            for future in waiting:
                future.cancel()
            raise EvaluationStopped(f"policy {self.policy!r}: evaluation stopped with the trainer")

    def _texts(self, response: GenerationResponse) -> list[str]:
        if response.error is not None:
            raise PoolUnanswered(f"policy {self.policy!r} refused an evaluation request: "
                                 f"{response.error}")  # fmt: skip
        if response.weight_version != self.version:
            self.off_version += 1
        return [c.text for c in response.completions]

    async def _listen(self) -> None:
        if not self._listening:
            await self.rt.nc.subscribe(
                self.rt.names.eval_replies_subject(self.policy), cb=self._on_reply
            )
            self._listening = True

    async def _on_reply(self, msg: Msg) -> None:
        await self.rt.resolve_reply(msg, self._waiting)
