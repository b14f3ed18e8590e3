"""What a workflow sees of the system: one episode, its generation and emission.

`Episode` hides NATS: `generate` publishes a GenerationRequest to the policy's work queue
and awaits the response (retrying under a fresh id after a timeout, so the stream's
de-duplication never swallows the retry); `emit` turns a completion and its reward into a
Trajectory for that policy's trainer, with a deterministic id so a retried publish is
de-duplicated rather than doubled. Multi-turn episodes hold a `Conversation` per policy and
sample: `converse` opens one, `reply` asks the policy, `tell` shows it a message (a user's
turn, a tool's output), `emit_conversation` sends it, all token-exact (`conversation`).
`judge` asks a policy for a score (LLM-as-judge, `judge`), bounded in time.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from polyrl.api.resources import RLJobSpec
from polyrl.api.wire import Completion, GenerationResponse
from polyrl.workers.models.prompts import PolicyPrompts, Prompt
from polyrl.workers.workflows import conversation as conv
from polyrl.workers.workflows.conversation import Conversation, ConversationTooLong, Message
from polyrl.workers.workflows.judge import Verdict, verdict_of
from polyrl.workers.workflows.sample import Sample

Generate = Callable[..., Awaitable[GenerationResponse]]
"""`(policy, prompt, n, budget)` and, for a temperature other than the job's, `temperature=`."""
Emit = Callable[[str, str, Sample, int, float], Awaitable[None]]
Settle = Callable[[], Awaitable[None]]
Prompts = Callable[[str], Awaitable[PolicyPrompts]]


async def nothing_held() -> None:
    """`Episode.settle` where nothing is held: every emit was sent at once."""


async def no_prompts(policy: str) -> PolicyPrompts:
    """`Episode`'s tokenizers where none were given (an episode built by hand, in a test)."""
    raise conv.ConversationOrder(f"this episode has no tokenizer for {policy!r}")


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
    _prompts: Prompts = no_prompts
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
    judge_fallbacks: dict[str, int] = field(default_factory=dict)
    """Failed verdicts, by judging policy, replaced by workflow.judge.fallbackScore."""

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
        self,
        policy: str,
        prompt: Prompt,
        n: int = 1,
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
    ) -> GenerationResponse:
        """`n` completions of `prompt` from `policy`: text, chat messages or token ids.

        The runner encodes the prompt with that policy's own tokenizer (and chat template),
        so text may cross between policies with different vocabularies; ids are the asked
        policy's. The budget is the policy's `maxNewTokens` where the manifest sets one, else
        `max_new_tokens`, else `algorithm.maxNewTokens`. A prompt the policy cannot take
        raises `prompts.PromptError` (the runner counts the episode as a dropped prompt).
        `temperature` other than the job's (algorithm.temperature; 0: greedy) is for answers
        that are not trained on, such as a judge's verdicts."""
        budget = self.budget(policy, max_new_tokens)
        if temperature is None:
            return await self._generate(policy, prompt, n, budget)
        return await self._generate(policy, prompt, n, budget, temperature=temperature)

    async def emit(
        self, policy: str, group: str, response: GenerationResponse, index: int, reward: float
    ) -> None:
        """Send completion `index` of `response` with its reward to `policy`'s trainer."""
        self._trained(policy)
        self.rewards.setdefault(policy, []).append(reward)
        await self._emit(policy, f"{self.id}/{group}", Sample.of(response, index), index, reward)

    async def judge(
        self, policy: str, prompt: Prompt, verdict: Verdict, *, max_new_tokens: int | None = None
    ) -> float:
        """`policy`'s score for what `prompt` shows it (LLM-as-judge): its answer (greedy,
        unless workflow.judge.temperature says otherwise) read by `verdict`. A verdict that fails (too slow for
        workflow.judge.timeoutSeconds, no rollout answered, no score in the answer) drops
        the episode (`JudgeFailed`, reason `judge`), or, where the job sets
        workflow.judge.fallbackScore, is that score, counted apart."""
        spec = self.spec.workflow.judge
        score = await verdict_of(
            lambda: self.generate(
                policy, prompt, 1, max_new_tokens=max_new_tokens, temperature=spec.temperature
            ),
            lambda response: self.text(response, 0),
            verdict,
            policy=policy,
            spec=spec,
        )
        if score is None:
            self.judge_fallbacks[policy] = self.judge_fallbacks.get(policy, 0) + 1
            return float(spec.fallback_score or 0.0)
        return score

    def _trained(self, policy: str) -> None:
        """Samples go to trained policies only: a frozen one has no trainer to take them."""
        spec = self.spec.policy(policy)
        if spec is not None and spec.frozen:
            raise ValueError(
                f"policy {policy!r} is frozen (never trained): emit no samples for it; "
                "ask it with generate or judge"
            )

    async def converse(self, policy: str, messages: Sequence[Message]) -> Conversation:
        """A conversation with `policy` that opens with `messages` (chat messages): ask for its
        replies with `reply`, answer them with `tell`, send it to the trainer with
        `emit_conversation`. Every turn extends the ids sampled and shown so far, never a
        re-tokenised history (`conversation`)."""
        prompts = await self._prompts(policy)
        ids = prompts.encode(list(messages), max_new_tokens=self.budget(policy))
        return Conversation.start(policy, messages, ids)

    async def reply(
        self, conversation: Conversation, n: int = 1, *, max_new_tokens: int | None = None
    ) -> list[Conversation]:
        """`n` replies of the policy to `conversation`, each a conversation of its own (a
        group's samples branch here). The budget is `generate`'s, cut to what is left of
        `workflow.maxContextTokens` (else of the model's context); past `workflow.maxTurns`, or with no room left, the
        episode is dropped (`ConversationTooLong`, counted by reason)."""
        limits, policy = self.spec.workflow, conversation.policy
        if conversation.replied:
            raise conv.ConversationOrder("the policy replied last: tell it something first")
        if conversation.turns >= limits.max_turns:
            raise ConversationTooLong(
                f"a conversation with {policy!r} reached workflow.maxTurns ({limits.max_turns})",
                reason="turns",
                policy=policy,
            )
        context = limits.max_context_tokens or (await self._prompts(policy)).context
        budget = self.budget(policy, max_new_tokens)
        if context is not None:
            budget = min(budget, context - len(conversation.ids))
            if budget < 1:
                raise ConversationTooLong(
                    f"a conversation with {policy!r} of {len(conversation.ids)} tokens has no "
                    f"room for a reply within {context} tokens (workflow.maxContextTokens, "
                    "else the model's context)",
                    reason="context",
                    policy=policy,
                )
        response = await self._generate(policy, list(conversation.ids), n, budget)
        return [conversation.with_reply(response, i) for i in range(len(response.completions))]

    async def tell(self, conversation: Conversation, *messages: Message) -> Conversation:
        """`conversation` with `messages` (a user's turn, a tool's output) shown to the policy
        after its last reply, as the ids its chat template adds for them."""
        prompts = await self._prompts(conversation.policy)
        ids = conv.message_ids(prompts.tokenizer, conversation, messages)
        return conversation.with_messages(messages, ids)

    async def emit_conversation(
        self, group: str, conversation: Conversation, index: int, reward: float
    ) -> None:
        """Send `conversation` with its reward to its policy's trainer: trained on its replies,
        with what it was shown masked out."""
        policy = conversation.policy
        self._trained(policy)
        self.rewards.setdefault(policy, []).append(reward)
        await self._emit(policy, f"{self.id}/{group}", conversation.sample(), index, reward)

    def budget(self, policy: str, max_new_tokens: int | None = None) -> int:
        """`policy`'s generation budget: its own `maxNewTokens`, else `max_new_tokens`, else
        algorithm.maxNewTokens."""
        spec = self.spec.policy(policy)
        own = spec.max_new_tokens if spec is not None else None
        return own or max_new_tokens or self.spec.algorithm.max_new_tokens

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


__all__ = ["Episode", "Sample"]
