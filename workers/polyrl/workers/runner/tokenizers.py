"""Each policy's tokenizer as the workflow runner holds it: from the policy's bundle, light.

The runner encodes every prompt with the asked policy's own tokenizer (`prompts`), so it needs
every policy's tokenizer, and it has no model directory: it takes the config and tokenizer
files from the bundle each trainer publishes when it starts (`bundle`), as rollout workers do.
transformers' tokenizer classes import torch, which the runner otherwise never needs (seconds
of CPU at start, beside the trainers' own imports), so a tokenizer with a `tokenizer.json` is
read with `tokenizers` and its chat template rendered with jinja2 (`BundleTokenizer`); only a
slow, sentencepiece-only tokenizer falls back to transformers.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polyrl.workers.models.prompts import PolicyPrompts, PromptError, context_of
from polyrl.workers.weightsync import bundle

if TYPE_CHECKING:
    from polyrl.workers.runtime.worker import Runtime

log = logging.getLogger("polyrl.prompts")


class BundleTokenizer:
    """What encoding prompts needs of a tokenizer, read from its files with `tokenizers` and
    jinja2 alone: transformers' tokenizer classes import torch, which the workflow runner
    otherwise never needs (seconds of CPU at start, beside the trainers' own imports).

    Encodes as `tokenizer(text)` does (the tokenizer.json's post-processor adds the special
    tokens) and renders chat templates as `apply_chat_template(..., tokenize=False)` does: a
    sandboxed jinja2 environment with `raise_exception`, `strftime_now` and the special tokens."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_file = directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.exists() else {}
        template_file = directory / "chat_template.jinja"
        template = template_file.read_text() if template_file.exists() else None
        self.chat_template = template or _default_template(config.get("chat_template"))
        self.special = {
            key: _token_text(config.get(key))
            for key in ("bos_token", "eos_token", "pad_token", "unk_token")
        }

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        encoding = self.backend.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": list(encoding.ids)}

    def __len__(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool, tokenize: bool
    ) -> str:
        if tokenize or not self.chat_template:
            raise PromptError("a bundle tokenizer renders chat templates as text only")
        return _render(self.chat_template, messages, add_generation_prompt, self.special)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def _default_template(value: Any) -> str | None:
    """tokenizer_config.json's chat_template: one string, or a list of named ones."""
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def _render(
    template: str, messages: list[dict[str, Any]], generation: bool, special: dict[str, Any]
) -> str:
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise PromptError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=generation, **special
        )
    except TemplateError as err:
        raise PromptError(f"the chat template failed: {err}") from None


def load(directory: Path, *, prompt_format: str, max_prompt_tokens: int | None) -> PolicyPrompts:
    """A policy's `PolicyPrompts` from its model bundle (config and tokenizer files)."""
    if (directory / "tokenizer.json").exists():
        tokenizer: Any = BundleTokenizer(directory)
    else:  # a slow (sentencepiece) tokenizer only: transformers it is
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    config = json.loads((directory / "config.json").read_text())
    vocab = config.get("vocab_size")
    return PolicyPrompts(
        tokenizer,
        prompt_format=prompt_format,
        max_prompt_tokens=max_prompt_tokens,
        context=context_of(config),
        vocab_size=vocab if isinstance(vocab, int) else None,
    )


class Tokenizers:
    """Each policy's prompt encoder, loaded on first use from the bundle its trainer publishes
    at its start (`bundle`), and kept: the workflow runner's view of every tokenizer."""

    def __init__(self, rt: Runtime, *, wait: float = 60.0) -> None:
        self.rt, self.wait = rt, wait
        self.loaded: dict[str, PolicyPrompts] = {}
        self.locks: dict[str, asyncio.Lock] = {}

    async def get(self, policy: str) -> PolicyPrompts:
        if policy in self.loaded:
            return self.loaded[policy]
        async with self.locks.setdefault(policy, asyncio.Lock()):
            if policy not in self.loaded:
                self.loaded[policy] = await self._load(policy)
        return self.loaded[policy]

    async def _load(self, policy: str) -> PolicyPrompts:
        spec = self.rt.config.spec.policy(policy)
        if spec is None:
            raise PromptError(f"policy {policy!r} is not in the job's spec")
        scratch = Path(tempfile.mkdtemp(prefix="polyrl-tokenizer-"))
        try:
            while True:  # a trainer publishes its bundle once it has loaded its model
                try:
                    directory = await bundle.fetch(
                        self.rt.js, self.rt.names, policy, scratch, timeout=self.wait
                    )
                    break
                except bundle.BundleMissing as err:
                    log.info("%s; still waiting", err)
            loaded = await asyncio.to_thread(
                load,
                directory,
                prompt_format=spec.model.prompt_format,
                max_prompt_tokens=spec.max_prompt_tokens,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        log.info("%s's tokenizer loaded (%d tokens)", policy, len(loaded.tokenizer))
        return loaded
