"""Multi-turn conversations kept token-exact: what a policy is trained on is what it sampled.

A conversation with a policy is a list of token ids that only ever grows. Each turn's prompt
is the previous turn's ids, plus the ids the policy just sampled, plus the ids of the messages
that answer it: never the whole history rendered and tokenised again. Re-tokenising breaks
training silently: a byte-level BPE tokenizer does not give back the ids that were sampled
(" the" sampled as " ", "t", "he" re-encodes as the one id " the"), so the sequence trained on
would hold ids the policy never wrote, scored against log-probs of ids it did.

A new message's ids are what the chat template adds for it (`message_ids`): the template
applied to the conversation and the message, with the generation prompt, minus the template
applied to the conversation alone, checked to extend it. What the template writes after a
sampled turn's end-of-turn id (ChatML's newline after `<|im_end|>`) goes with the new message;
where the policy was cut short (`finish_reason == "length"`) the template's own end of turn
does too. Rendering the message on its own instead would go wrong: SmolLM2's template puts
its default system prompt before the first message it is given. A template that rewrites
earlier turns once a message follows them (Qwen3's drops old `<think>` blocks) cannot be kept
exact this way and is refused, naming the first place the renderings differ
(`TemplateRewritesHistory`).

The trainer is sent the ids as they are, with a loss mask: on for the ids the policy sampled
(with their behaviour log-probs), off for everything it was shown (`Conversation.sample`).
Conversations are values: each turn or message gives a new one, so the samples of a group
branch from one prompt. Limits (`workflow.maxTurns`, `workflow.maxContextTokens`) drop the
episode with a counted reason (`ConversationTooLong`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from polyrl.api.wire import GenerationResponse
from polyrl.workers.models import prompts
from polyrl.workers.models.prompts import PromptError
from polyrl.workers.workflows.dropped import EpisodeDropped
from polyrl.workers.workflows.sample import Sample

Message = Mapping[str, str]


class TemplateRewritesHistory(PromptError):
    """The policy's chat template renders earlier turns differently once a message follows."""


class ConversationTooLong(EpisodeDropped):
    """A conversation past `workflow.maxTurns` or `workflow.maxContextTokens`."""


class ConversationOrder(ValueError):
    """A workflow asked for a reply where a message was due, or the reverse (a bug in it)."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """One policy's side of a conversation: its messages, and its ids as sampled and shown."""

    policy: str
    messages: tuple[dict[str, str], ...]
    """The conversation as chat messages (replies as decoded text), for the template."""
    ids: tuple[int, ...]
    """Every id so far: the first prompt, then each reply as sampled and each message shown."""
    sampled: tuple[bool, ...]
    """Per id: whether the policy sampled it (the loss mask)."""
    logprobs: tuple[float, ...]
    """Per id: its behaviour log-prob where sampled, else 0."""
    prompt_length: int
    """Ids of the first prompt."""
    versions: tuple[int, ...] = ()
    """The weight version of each reply."""
    finish: str | None = None
    """How the last reply ended ("stop" or "length"); None once a message follows it."""
    cut: bool = False
    """Whether any reply was cut at the length limit (finish reason "length")."""

    @classmethod
    def start(cls, policy: str, messages: Sequence[Message], ids: Sequence[int]) -> Conversation:
        """A conversation whose first prompt is `messages`, encoded as `ids`."""
        return cls(
            policy=policy,
            messages=tuple(dict(m) for m in messages),
            ids=tuple(ids),
            sampled=(False,) * len(ids),
            logprobs=(0.0,) * len(ids),
            prompt_length=len(ids),
        )

    @property
    def turns(self) -> int:
        """The policy's replies so far."""
        return len(self.versions)

    @property
    def replied(self) -> bool:
        """Whether the policy spoke last (a message is due, not a reply)."""
        return self.turns > 0 and self.messages[-1]["role"] == "assistant"

    @property
    def last(self) -> str:
        """The text of the policy's last reply."""
        if not self.replied:
            raise ConversationOrder("the policy has not replied since the last message")
        return self.messages[-1]["content"]

    def with_reply(self, response: GenerationResponse, index: int) -> Conversation:
        """This conversation with completion `index` of `response` (asked with `ids`) added."""
        if self.replied:
            raise ConversationOrder("the policy replied last: tell it something first")
        if tuple(response.prompt_tokens) != self.ids:
            raise ConversationOrder("the response answers another prompt than this conversation")
        completion = response.completions[index]
        return replace(
            self,
            messages=(*self.messages, {"role": "assistant", "content": completion.text}),
            ids=self.ids + tuple(completion.tokens),
            sampled=self.sampled + (True,) * len(completion.tokens),
            logprobs=self.logprobs + tuple(completion.logprobs),
            versions=(*self.versions, response.weight_version),
            finish=completion.finish_reason,
            cut=self.cut or completion.finish_reason == "length",
        )

    def with_messages(self, messages: Sequence[Message], ids: Sequence[int]) -> Conversation:
        """This conversation with `messages` shown, as `ids` (`message_ids`)."""
        return replace(
            self,
            messages=(*self.messages, *(dict(m) for m in messages)),
            ids=self.ids + tuple(ids),
            sampled=self.sampled + (False,) * len(ids),
            logprobs=self.logprobs + (0.0,) * len(ids),
            finish=None,
        )

    def sample(self) -> Sample:
        """What the trainer is sent: the first prompt, then the rest under the loss mask. Its
        weight version is the oldest reply's, so the staleness bound holds for every turn."""
        if not self.versions:
            raise ConversationOrder("a conversation with no reply has nothing to train on")
        p = self.prompt_length
        return Sample(
            prompt_tokens=list(self.ids[:p]),
            tokens=list(self.ids[p:]),
            logprobs=list(self.logprobs[p:]),
            loss_mask=list(self.sampled[p:]),
            weight_version=min(self.versions),
            finish_reason="length" if self.cut else "stop",
        )


def message_ids(
    tokenizer: Any, conversation: Conversation, messages: Sequence[Message]
) -> list[int]:
    """The ids that show `messages` after the policy's last reply: the template's rendering of
    the conversation with them (and the generation prompt) past its rendering without them,
    led by whatever the template writes after the reply's end (see the module docstring)."""
    if not conversation.replied:
        raise ConversationOrder("a message is shown after a reply: ask the policy first")
    history = conversation.messages
    before = prompts.render_chat(tokenizer, history, generation=False)
    after = prompts.render_chat(tokenizer, [*history, *messages], generation=True)
    _check_extends(before, after, "the new message follows it")
    before_ids, after_ids = (
        prompts.rendered_ids(tokenizer, before),
        prompts.rendered_ids(tokenizer, after),
    )
    if after_ids[: len(before_ids)] != before_ids:
        raise TemplateRewritesHistory(
            "the chat template's text for the conversation ends inside a token once a message "
            "follows it, so the message's ids cannot be appended"
        )
    return _reply_end(tokenizer, conversation, before_ids) + after_ids[len(before_ids) :]


def _reply_end(tokenizer: Any, conversation: Conversation, before_ids: list[int]) -> list[int]:
    """What the template writes after the last reply's text: its end-of-turn id (unless the
    policy sampled it) and the separator after it."""
    history = conversation.messages
    prompt = prompts.render_chat(tokenizer, history[:-1], generation=True)
    whole = prompts.render_chat(tokenizer, history, generation=False)
    _check_extends(prompt, whole, "the reply follows it")
    reply = whole[len(prompt) :]
    text = history[-1]["content"]
    if not reply.startswith(text):
        raise TemplateRewritesHistory(
            f"the chat template renders the reply {text[:60]!r} as {reply[:60]!r}: it changes "
            "what the policy wrote"
        )
    closing = prompts.rendered_ids(tokenizer, reply[len(text) :])
    if before_ids[len(before_ids) - len(closing) :] != closing:
        raise TemplateRewritesHistory(
            "the chat template's end of a reply is not a token boundary of the conversation"
        )
    ended = conversation.finish == "stop" and closing and conversation.ids[-1] == closing[0]
    return closing[1:] if ended else closing


def _check_extends(before: str, after: str, what: str) -> None:
    if after.startswith(before):
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
        min(len(before), len(after)),
    )
    raise TemplateRewritesHistory(
        f"the chat template rewrites the conversation once {what}: at character {at} it "
        f"rendered {before[at : at + 40]!r}, now {after[at : at + 40]!r} (a template that drops "
        "or edits earlier turns, as Qwen3's drops old <think> blocks, cannot be kept "
        "token-exact; give the policy a template that leaves history as it was)"
    )


def retokenized(tokenizer: Any, conversation: Conversation) -> list[int]:
    """The ids a whole-history re-tokenisation would give (what this module avoids): for
    tests and diagnostics, compared with `conversation.ids`."""
    return prompts.rendered_ids(
        tokenizer, prompts.render_chat(tokenizer, conversation.messages, generation=False)
    )


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where `a` and `b` differ (the shorter one's length if one is a prefix
    of the other); None when equal."""
    if list(a) == list(b):
        return None
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


__all__ = [
    "Conversation",
    "ConversationOrder",
    "ConversationTooLong",
    "Message",
    "TemplateRewritesHistory",
    "first_difference",
    "message_ids",
    "retokenized",
]
