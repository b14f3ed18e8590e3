"""The workflow runner's generation client: requests out on the policies' work queues, replies in.

A workflow asks a policy for completions as if it were a call (`Episode.generate`); underneath
it is a message each way. A request goes to the policy's request stream with a reply subject
private to this runner (`inbox`), and whichever rollout worker takes it answers there; the
answer is matched to its request by id. A request unanswered within `request_timeout` is
retried under a fresh id: the work queue de-duplicates by id, so the same id would be
swallowed. The prompt becomes ids here first, with the asked policy's own tokenizer
(`tokenizers`), since policies may not share a vocabulary.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid

from nats.aio.msg import Msg
from nats.js.errors import APIError

from polyrl.api import natsconfig
from polyrl.api.wire import GenerationRequest, GenerationResponse
from polyrl.workers.errors import StorageFull
from polyrl.workers.models.prompts import Prompt, PromptError
from polyrl.workers.runner.tokenizers import Tokenizers
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.workflows.dropped import EpisodeDropped

log = logging.getLogger("polyrl.workflow")


class GenerationTimeout(EpisodeDropped):
    """No rollout worker answered a request after every retry: the episode is dropped and
    counted for the policy asked (reason `generation`), never stored as a zero reward."""

    reason = "generation"


class GenerationRefused(PromptError):
    """A rollout worker answered with an error: the request's ids do not fit its model."""


class GenerationClient:
    """Sends generation requests and hands each reply to the request waiting for it."""

    def __init__(self, rt: Runtime, *, request_timeout: float, retries: int) -> None:
        self.rt = rt
        self.request_timeout = request_timeout
        self.retries = retries
        self.inbox = f"{rt.names.prefix}.replies.{rt.pod}"
        self.waiting: dict[str, asyncio.Future[GenerationResponse]] = {}
        self.counter = itertools.count()
        self.replies = 0  # replies received: a drain asks whether any still come
        # Request ids are message ids the request stream deduplicates for two minutes: a runner
        # that replaces a killed one under the same pod name must not reuse its ids.
        self.boot = uuid.uuid4().hex[:8]
        self.tokenizers = Tokenizers(rt)

    async def listen(self) -> None:
        """Take replies on `inbox` from now on."""
        await self.rt.nc.subscribe(self.inbox, cb=self._on_reply)

    async def encode(self, policy: str, prompt: Prompt, max_new: int) -> list[int]:
        """`prompt` as ids of `policy`'s tokenizer (`prompts`)."""
        encoder = await self.tokenizers.get(policy)
        return encoder.encode(prompt, max_new_tokens=max_new)

    async def request(
        self,
        policy: str,
        prompt: list[int],
        n: int,
        max_new: int,
        *,
        min_version: int,
        temperature: float | None = None,
    ) -> GenerationResponse:
        """One request, retried on timeout under a fresh id; at the job's temperature
        unless given another (0: greedy)."""
        if temperature is None:
            temperature = self.rt.config.spec.algorithm.temperature
        for attempt in range(self.retries):
            rid = f"{self.rt.pod}-{self.boot}-{next(self.counter)}-{attempt}"
            request = GenerationRequest(
                id=rid,
                episode_id=rid,
                policy=policy,
                prompt_tokens=prompt,
                n=n,
                max_new_tokens=max_new,
                temperature=temperature,
                min_version=min_version,
                reply_to=self.inbox,
            )
            future: asyncio.Future[GenerationResponse] = asyncio.get_running_loop().create_future()
            self.waiting[rid] = future
            try:
                await self._publish(policy, request)
                response = await asyncio.wait_for(future, timeout=self.request_timeout)
            except TimeoutError:
                log.info("request %s to %s timed out; retrying", rid, policy)
            else:
                if response.error is not None:
                    raise GenerationRefused(
                        f"policy {policy!r} refused a request: {response.error}"
                    )
                return response
            finally:
                self.waiting.pop(rid, None)
        raise GenerationTimeout(
            f"no answer from policy {policy!r} after {self.retries} tries", policy=policy
        )

    async def _publish(self, policy: str, request: GenerationRequest) -> None:
        try:
            await self.rt.js.publish(
                self.rt.names.requests_subject(policy),
                request.model_dump_json().encode(),
                headers={"Nats-Msg-Id": request.id},
            )
        except APIError as err:
            if not natsconfig.is_full(err):
                raise
            raise StorageFull(
                f"the request queue of policy {policy!r} is full "
                f"({natsconfig.REQUEST_CAP} requests waiting): no rollout worker takes them"
            ) from err

    async def _on_reply(self, msg: Msg) -> None:
        self.replies += 1
        await self.rt.resolve_reply(msg, self.waiting)
