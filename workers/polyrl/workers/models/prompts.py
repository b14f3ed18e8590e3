"""Prompts into token ids, once, with the policy's own tokenizer and chat template.

A workflow asks a policy with text, chat messages or token ids (`Episode.generate`); the
workflow runner turns each into ids here, with *that policy's* tokenizer, and generation
requests carry ids from then on. Rollout engines see ids, trajectories carry ids, and the
trainer trains on exactly those ids: nothing on the way decodes and re-encodes, which with a
byte-level BPE tokenizer can change them (" the" sampled as " ", "t", "he" re-encodes as the
one token " the"). Text crosses between policies; ids never do, so two policies with different
vocabularies work in one job.

The same function serves the trainer's warm-up and evaluation, so a policy whose prompts go
through its chat template (`model.promptFormat: chat`) sees the same ids in every stage.

Length rules: a prompt longer than its limit (the policy's `maxPromptTokens`, and in any case
its model's context less the generation budget) is refused with `PromptTooLong`, never
truncated: cutting a math problem short changes its answer. The workflow runner counts such
episodes as dropped prompts and goes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from polyrl.api.model_source import PromptFormat

Message = Mapping[str, str]


Prompt = str | Sequence[Mapping[str, str]] | Sequence[int]
"""Text, chat messages ({"role", "content"}) or the policy's token ids."""


class PromptError(ValueError):
    """A prompt that cannot be turned into ids for its policy (the cause is in the message)."""


class PromptTooLong(PromptError):
    """A prompt with more tokens than its policy takes; counted as a dropped prompt."""


def kind(prompt: Prompt) -> str:
    """'text', 'messages' or 'ids'; PromptError for anything else (or an empty prompt)."""
    if isinstance(prompt, str):
        return "text"
    if isinstance(prompt, Sequence) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return "ids"
        if all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt):
            return "messages"
    raise PromptError(
        "a prompt is text, a non-empty list of chat messages ({'role', 'content'}) or a "
        f"non-empty list of token ids; got {type(prompt).__name__} {str(prompt)[:80]!r}"
    )


def render_chat(tokenizer: Any, messages: Sequence[Message], *, generation: bool) -> str:
    """`messages` through the tokenizer's chat template, as text (with the generation prompt
    when `generation`)."""
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError(
            "chat messages need a tokenizer with a chat template, and this policy's has none: "
            "send text or token ids, or use a tokenizer that has one"
        )
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=generation, tokenize=False
    )
    return str(text)


def rendered_ids(tokenizer: Any, text: str) -> list[int]:
    """Text a chat template rendered, as ids: the template wrote its own special tokens (a
    Llama 3 template its BOS), so none are added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def chat_ids(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """`messages` through the tokenizer's chat template, with the generation prompt, once."""
    return rendered_ids(tokenizer, render_chat(tokenizer, messages, generation=True))


def ids_for(tokenizer: Any, prompt: str | Sequence[Message]) -> list[int]:
    """A task prompt's ids as the trainer's warm-up and evaluation encode it: chat messages
    through the template, text as `tokenizer(text)` (a chat-format policy's tokenizer is a
    `PromptTokenizer`, which templates that too)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    return chat_ids(tokenizer, prompt)


@dataclass(frozen=True)
class PolicyPrompts:
    """How one policy's prompts become ids: its tokenizer, prompt format and length limits."""

    tokenizer: Any
    prompt_format: str = PromptFormat.TEXT
    max_prompt_tokens: int | None = None
    """The policy's own limit (`maxPromptTokens`), if it set one."""
    context: int | None = None
    """The model's context (`max_position_embeddings`): prompt and completion together."""
    vocab_size: int | None = None

    def encode(self, prompt: Prompt, *, max_new_tokens: int = 0) -> list[int]:
        """Ids for `prompt`; text goes through the chat template when the format says chat.

        PromptTooLong when the ids leave no room for `max_new_tokens` in the model's context,
        or exceed the policy's limit."""
        what = kind(prompt)
        if what == "ids":
            ids = [int(t) for t in cast(Sequence[int], prompt)]
            self._check_vocab(ids)
        elif what == "messages":
            ids = chat_ids(self.tokenizer, prompt)  # type: ignore[arg-type]
        elif self.prompt_format == PromptFormat.CHAT:
            ids = chat_ids(self.tokenizer, [{"role": "user", "content": str(prompt)}])
        else:
            ids = list(self.tokenizer(prompt)["input_ids"])
        if not ids:
            raise PromptError(f"prompt {str(prompt)[:80]!r} encodes to no tokens")
        most = limit(self.max_prompt_tokens, self.context, max_new_tokens)
        if most is not None and len(ids) > most:
            raise PromptTooLong(
                f"prompt of {len(ids)} tokens is longer than the policy's limit of {most} "
                "(maxPromptTokens, within the model's context less the generation budget)"
            )
        return ids

    def _check_vocab(self, ids: list[int]) -> None:
        if self.vocab_size is None:
            return
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise PromptError(f"token ids outside this policy's vocabulary [0, {self.vocab_size})")


def limit(max_prompt_tokens: int | None, context: int | None, max_new_tokens: int) -> int | None:
    """The longest prompt a policy takes: its own limit, within its model's context."""
    room = None if context is None else max(1, context - max_new_tokens)
    if max_prompt_tokens is None:
        return room
    return max_prompt_tokens if room is None else min(max_prompt_tokens, room)


def context_of(config: Mapping[str, Any]) -> int | None:
    """A model's context length from its config.json's fields, if it states one."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


class PromptTokenizer:
    """A chat-format policy's tokenizer as its warm-up and evaluation call it.

    They encode a prompt as `tokenizer(text)` and an answer as `tokenizer(text,
    add_special_tokens=False)`; here the first goes through the chat template (the same ids
    the workflow runner sends in RL) and everything else is the tokenizer's own."""

    def __init__(self, tokenizer: Any) -> None:
        self._prompts = PolicyPrompts(tokenizer, prompt_format=PromptFormat.CHAT)
        self._tokenizer = tokenizer

    def __call__(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str) and not args and kwargs.get("add_special_tokens", True):
            return {"input_ids": self._prompts.encode(text)}
        return self._tokenizer(text, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def for_training(tokenizer: Any, prompt_format: str) -> Any:
    """The tokenizer warm-up and evaluation should use for a policy of this prompt format."""
    return PromptTokenizer(tokenizer) if prompt_format == PromptFormat.CHAT else tokenizer
