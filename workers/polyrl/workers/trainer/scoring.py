"""A policy's model as evaluators see it: greedy answers and their accuracy.

Evaluators (`workflows.interface.Evaluator`) get a `workflows.interface.Scorer`, not the
trainer; this is the one the trainer gives: the model, its tokenizer and
the policy's generation budget, with the two questions held-out evaluation asks of them. The
decoding itself is `warmup`'s batched greedy generation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from polyrl.workers.tasks import base
from polyrl.workers.trainer import warmup


@dataclass(slots=True)
class ModelScorer:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    max_new_tokens: int
    """The policy's generation budget (`workflows.interface.budget`)."""
    answer_tokens: int
    """An answer's budget, algorithm.maxNewTokens (a verifier's working is one)."""

    def greedy(
        self,
        prompts: Sequence[str | Sequence[Mapping[str, str]]],
        *,
        max_new_tokens: int | None = None,
    ) -> list[str]:
        """Greedy completions of `prompts`, in the policy's budget unless told otherwise."""
        torch.nn.Module.eval(self.model)
        budget = max_new_tokens or self.max_new_tokens
        out: list[str] = []
        for start in range(0, len(prompts), 128):
            chunk = prompts[start : start + 128]
            out += warmup.greedy_completions(self.model, self.tokenizer, chunk, budget)
        return out

    def accuracy(
        self,
        problems: Sequence[base.Problem],
        *,
        reward: Callable[[base.Problem, str], float],
        max_new_tokens: int | None = None,
    ) -> float:
        """The mean `reward` of greedy completions of `problems`."""
        torch.nn.Module.eval(self.model)
        return warmup.greedy_accuracy(
            self.model,
            self.tokenizer,
            problems,
            max_new_tokens=max_new_tokens or self.max_new_tokens,
            reward=reward,
        )
