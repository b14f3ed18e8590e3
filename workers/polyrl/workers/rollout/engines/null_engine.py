"""A benchmark part: an engine that answers every prompt at once, without a model.

`polyrl bench dataplane` (and fault-injection runs where the model does not matter) drive the
data plane (requests, responses, trajectories, acknowledgements) harder than any model could
generate: this engine continues each prompt with `max_new_tokens` canned tokens and
log-probs, so what is measured is NATS, the wire models and the workers' own loops. It
satisfies `base.Engine` like the real engines, but a manifest cannot name it
(`rollout.engine` is `torch` or `vllm`); benchmarks build it directly.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from polyrl.workers.rollout.engines.base import Generation, SamplingParams

CANNED_LOGPROB = -0.5


class NullEngine:
    """Canned generations: token `token` repeated, each with log-prob `CANNED_LOGPROB`."""

    def __init__(self, model: object = None, *, device: str = "cpu", token: int = 1) -> None:
        self.version = 0
        self.device = device
        self.weights_are_live = False
        self.token = token
        self.generated = 0  # sequences answered, for the benchmark's own check
        self.loads = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if any(not prompt for prompt in prompts):
            raise ValueError("every prompt needs at least one token")
        n = params.max_new_tokens
        self.generated += len(prompts)
        return [
            Generation(
                tokens=[self.token] * n, logprobs=[CANNED_LOGPROB] * n, finish_reason="length"
            )
            for _ in prompts
        ]

    def weights(self) -> dict[str, torch.Tensor]:
        return {}

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        self.loads += 1  # nothing to load into; counted so a benchmark sees syncs happen
