"""A benchmark part: an engine that takes the time a latency model says, without a model.

`polyrl bench pipeline --simulated` and `polyrl bench scale` measure the system around
generation (queues, the workflow runner, weight announcements, the trainer's intake) at the
speeds of hardware this machine does not have: each call waits as long as
`runtime.simulation.LatencyModel` says the batch would take on a replica of speed `speed`,
divided by `compression`, and returns responses of the modelled lengths (a stop token ends
those shorter than the limit). The waiting is `asyncio.sleep` (`base.GeneratesAsync`), so
dozens of replicas share one process; nothing here imports torch. Like `NullEngine`, a
manifest cannot name it: benchmarks build it directly.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from typing import Any

from polyrl.workers.rollout.engines.base import Generation, SamplingParams
from polyrl.workers.runtime.simulation import LatencyModel

LOGPROB = -1.0


class SimulatedEngine:
    """Modelled generation; `modelled` and `calls` count what it was asked, for the figures."""

    def __init__(
        self,
        model: LatencyModel,
        *,
        speed: float = 1.0,
        compression: float = 1.0,
        token: int = 5,
        seed: int = 0,
        device: str = "simulated",
    ) -> None:
        if speed <= 0 or compression <= 0:
            raise ValueError(f"speed and compression must be > 0, got {speed}, {compression}")
        self.version = 0
        self.device = device
        self.weights_are_live = False
        self.model, self.speed, self.compression, self.token = model, speed, compression, token
        self.rng = random.Random(seed)
        self.modelled = 0.0  # modelled seconds of generation so far
        self.calls = 0
        self.sequences = 0
        self.spans: list[tuple[float, float]] = []  # per call: its start (monotonic), modelled s

    def _plan(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[list[Generation], float]:
        if any(not prompt for prompt in prompts):
            raise ValueError("every prompt needs at least one token")
        stop = params.stop_token_ids[0] if params.stop_token_ids else None
        outputs = []
        for _ in prompts:
            n = self.model.length(self.rng, params.max_new_tokens)
            ends = stop is not None and n < params.max_new_tokens
            tokens = [self.token] * (n - 1) + [stop if ends and stop is not None else self.token]
            outputs.append(
                Generation(
                    tokens=tokens,
                    logprobs=[LOGPROB] * n,
                    finish_reason="stop" if ends else "length",
                )
            )
        lengths = [len(g.tokens) for g in outputs]
        seconds = self.model.seconds(sum(len(p) for p in prompts), lengths, self.speed)
        self.modelled += seconds
        self.spans.append((time.monotonic(), seconds))
        self.calls += 1
        self.sequences += len(prompts)
        return outputs, seconds / self.compression

    async def agenerate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        outputs, wall = self._plan(prompts, params)
        await asyncio.sleep(wall)
        return outputs

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        outputs, wall = self._plan(prompts, params)
        time.sleep(wall)
        return outputs

    def weights(self) -> dict[str, Any]:
        return {}

    def load_weights(self, state: Mapping[str, Any]) -> None:
        """Nothing to load: weights are modelled by their version alone."""
