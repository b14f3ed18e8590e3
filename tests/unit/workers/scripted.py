"""A scripted rollout pool for workflow tests: the edge a test cannot run (sampling), replaced.

The tokenizers and chat templates are real (the tiny BPE models', read the way the workflow
runner reads them); the pool answers each request with the next scripted reply, token ids a
sampler could produce, and records the prompts it was sent.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polyrl.api.model_source import PromptFormat
from polyrl.api.resources import RLJobSpec
from polyrl.api.wire import Completion, GenerationResponse
from polyrl.workers.models.prompts import PolicyPrompts
from polyrl.workers.runner import tokenizers as policy_tokenizers
from polyrl.workers.workflows import Episode
from polyrl.workers.workflows.sample import Sample

TinyBpe = Callable[[str], Path]
POLICY = "agent"


def spec(group_size: int = 8, **workflow: Any) -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "policies": [{"name": POLICY, "model": {"path": "tiny-bpe://qwen2/t"}}],
            "workflow": workflow,
            "algorithm": {"maxNewTokens": 8, "groupSize": group_size},
        }
    )


def load(tiny_bpe: TinyBpe, arch: str, template: str | None = None) -> PolicyPrompts:
    prompts = policy_tokenizers.load(
        tiny_bpe(arch), prompt_format=PromptFormat.CHAT, max_prompt_tokens=None
    )
    if template is not None:
        prompts.tokenizer.chat_template = template
    return prompts


class Pool:
    """The rollout pool's edge: answers each request with the next scripted reply (token
    ids, and whether they end with the end-of-turn id), and records the prompts it was sent."""

    def __init__(self, prompts: PolicyPrompts, replies: list[tuple[list[int], bool]]) -> None:
        self.prompts, self.replies = prompts, list(replies)
        self.sent: list[list[int]] = []
        self.eos = prompts.tokenizer.backend.token_to_id(prompts.tokenizer.special["eos_token"])
        self.version = 0

    def text(self, text: str, *, stops: bool = True) -> tuple[list[int], bool]:
        """A scripted reply of `text`, as the tokenizer encodes it."""
        return list(self.prompts.tokenizer(text, add_special_tokens=False)["input_ids"]), stops

    async def generate(self, policy: str, prompt: Any, n: int, budget: int) -> GenerationResponse:
        ids = self.prompts.encode(prompt, max_new_tokens=budget)
        self.sent.append(ids)
        completions = []
        for _ in range(n):
            reply, stops = self.replies.pop(0)
            tokens = [*reply, self.eos] if stops else reply[:budget]
            completions.append(
                Completion(
                    tokens=tokens,
                    logprobs=[-0.5] * len(tokens),
                    text=self.prompts.tokenizer.backend.decode(tokens, skip_special_tokens=True),
                    finish_reason="stop" if stops else "length",
                )
            )
        self.version += 1
        return GenerationResponse(
            id="r", pod="p", weight_version=self.version, prompt_tokens=ids, completions=completions
        )


def episode(
    prompts: PolicyPrompts, pool: Pool, job: RLJobSpec | None = None, *, task: Any = None
) -> tuple[Episode, list[Sample]]:
    """An episode over `pool`, whose emitted samples land in the list returned with it."""
    sent: list[Sample] = []

    async def emit(policy: str, group: str, sample: Sample, index: int, reward: float) -> None:
        sent.append(sample)

    async def policy_prompts(policy: str) -> PolicyPrompts:
        return prompts

    made = Episode(
        id="e",
        spec=job or spec(),
        task=task,
        rng=random.Random(0),
        _generate=pool.generate,
        _emit=emit,
        _prompts=policy_prompts,
    )
    return made, sent
