"""What a workflow sees of the system: one episode, its generation and emission.

`Episode` hides NATS: `generate` publishes a GenerationRequest to the policy's work queue
and awaits the response (retrying under a fresh id after a timeout, so the stream's
de-duplication never swallows the retry); `emit` turns a completion and its reward into a
Trajectory for that policy's trainer, with a deterministic id so a retried publish is
de-duplicated rather than doubled.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from polyrl.api.resources import RLJobSpec
from polyrl.api.wire import Completion, GenerationResponse
from polyrl.workers.models.prompts import Prompt

Generate = Callable[[str, Prompt, int, int], Awaitable[GenerationResponse]]
Emit = Callable[[str, str, GenerationResponse, int, float], Awaitable[None]]
Settle = Callable[[], Awaitable[None]]


async def nothing_held() -> None:
    """`Episode.settle` where nothing is held: every emit was sent at once."""


@dataclass
class Episode:
    """One episode: an id, the job's spec, a task, a seeded RNG and the two verbs."""

    id: str
    spec: RLJobSpec
    task: Any
    rng: random.Random
    _generate: Generate
    _emit: Emit
    _settle: Settle = nothing_held
    finished: frozenset[str] = frozenset()
    """Policies whose trainers are done (their final version announced): a workflow should
    ask them for no more samples, which would be wasted."""
    warming: frozenset[str] = frozenset()
    """Policies whose trainers announced no weights yet (still warming up): asking them holds
    the episode until they do. Always empty in sync mode, whose rounds wait for every policy."""
    catching_up: frozenset[str] = frozenset()
    """Policies asked for as many samples as their trainers can take within maxStaleness
    (async mode, `staleness`): asking them now holds the episode until their trainers catch up."""
    rewards: dict[str, list[float]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    """Why samples were not emitted (`drop`): the runner counts and logs them."""

    def available(self, policy: str) -> bool:
        """Whether asking `policy` now is useful: its trainer has weights out, is not done and
        can take more samples within maxStaleness.

        For the parts of a workflow that can go without a policy (the verifier's verdicts),
        not for the ones that cannot (the solver's answers): those should just ask."""
        return not any(policy in s for s in (self.finished, self.warming, self.catching_up))

    @property
    def group_size(self) -> int:
        return self.spec.algorithm.group_size

    async def generate(
        self, policy: str, prompt: Prompt, n: int = 1, *, max_new_tokens: int | None = None
    ) -> GenerationResponse:
        """`n` completions of `prompt` from `policy`: text, chat messages or token ids.

        The runner encodes the prompt with that policy's own tokenizer (and chat template),
        so text may cross between policies with different vocabularies; ids are the asked
        policy's. The budget is the policy's `maxNewTokens` where the manifest sets one, else
        `max_new_tokens`, else `algorithm.maxNewTokens`. A prompt the policy cannot take
        raises `prompts.PromptError` (the runner counts the episode as a dropped prompt)."""
        spec = self.spec.policy(policy)
        own = spec.max_new_tokens if spec is not None else None
        limit = own or max_new_tokens or self.spec.algorithm.max_new_tokens
        return await self._generate(policy, prompt, n, limit)

    async def emit(
        self, policy: str, group: str, response: GenerationResponse, index: int, reward: float
    ) -> None:
        """Send completion `index` of `response` with its reward to `policy`'s trainer."""
        self.rewards.setdefault(policy, []).append(reward)
        await self._emit(policy, f"{self.id}/{group}", response, index, reward)

    def drop(self, reason: str) -> None:
        """A sample left out because it could not be scored (its reward function failed)."""
        self.dropped.append(reason)

    async def settle(self) -> None:
        """The samples emitted so far are whole groups: send them now, not at the episode's end.

        Only a `trainer.uniformGroups: refill` policy's samples wait for the end (`polyrl.workers.runner.uniform_groups`: a
        group is known whole only then). A workflow that goes on to ask another policy after
        emitting one's groups (solver-verifier: the verifier judges the solver's answers)
        settles first, so those samples do not grow stale meanwhile; with refill the
        solver's trainer dropped 17-25 samples a step for that while the verifier trained."""
        await self._settle()

    @staticmethod
    def text(response: GenerationResponse, index: int) -> str:
        completion: Completion = response.completions[index]
        return completion.text


__all__ = ["Episode"]
