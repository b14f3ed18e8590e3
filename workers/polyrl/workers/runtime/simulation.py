"""Simulated compute: how long generation and training would take, from a few parameters.

On a machine where generation and training share the same cores, measuring asynchronous
against synchronous RL measures contention as much as design; and a fleet of dozens of GPU
replicas cannot be had at all. So benchmarks can replace the math, and only the math, by time
taken from a latency model, around everything else that is real: NATS, the workflow runner,
the rollout workers' loops and the trainer's intake (`rollout.engines.simulated_engine`,
`trainer.simulated`). Nothing here imports torch: many simulated replicas run in one process.

The model, per replica and per `generate` call (a rollout worker serves each batch it fetches
with one call, and a statically batched call lasts as long as its longest sequence):

    seconds = (overhead + prefill * prompt_tokens + decode * max(lengths)) / speed

Response lengths are log-normal around `median_tokens`, capped at the request's limit:
`tail` (the log-normal's sigma) sets how long the long tail is (0.3: light, 1.0: heavy, where
one sequence in 20 is five times the median). `speed` is a replica's factor (mixed hardware).
A trainer step takes `train_fixed + train_per_token * tokens` (prompt and response tokens).

Modelled seconds run `compression` times faster than wall time, so an iteration modelled at
minutes runs in seconds; what the system itself costs (orchestration) is wall time, and shows
as the difference between a measured step and the model's prediction for it.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyModel:
    """Modelled generation time of one replica; see the module docstring."""

    prefill: float = 2e-4
    """Seconds per prompt token of the batch (prefill is compute-bound: every token counts)."""
    decode: float = 0.03
    """Seconds per decoding step; every sequence of the batch advances one token a step."""
    overhead: float = 0.0
    """Seconds per call, whatever it holds (scheduling, sampling set-up)."""
    median_tokens: int = 256
    """Median response length in tokens."""
    tail: float = 0.5
    """Sigma of the log-normal response length: 0 none, 0.3 light, 1.0 heavy."""

    def __post_init__(self) -> None:
        if min(self.prefill, self.decode, self.overhead, self.tail) < 0:
            raise ValueError("latency model parameters must be >= 0")
        if self.median_tokens < 1:
            raise ValueError(f"median_tokens must be at least 1, got {self.median_tokens}")

    def length(self, rng: random.Random, limit: int) -> int:
        """One response's length in tokens, at least 1 and at most `limit`."""
        if not self.tail:
            return max(1, min(limit, self.median_tokens))
        drawn = self.median_tokens * math.exp(rng.gauss(0.0, self.tail))
        return max(1, min(limit, round(drawn)))

    def seconds(self, prompt_tokens: int, lengths: list[int], speed: float = 1.0) -> float:
        """Modelled seconds of one call generating `lengths` after `prompt_tokens` in all."""
        longest = max(lengths, default=0)
        return (self.overhead + self.prefill * prompt_tokens + self.decode * longest) / speed


@dataclass(frozen=True)
class TrainCost:
    """Modelled seconds of one trainer step, from the tokens of its batch."""

    fixed: float = 0.0
    """Seconds per step whatever the batch (optimizer step, weight publication)."""
    per_token: float = 0.0
    """Seconds per token of the batch (prompt and response: forward and backward)."""

    def seconds(self, tokens: int) -> float:
        return self.fixed + self.per_token * tokens


@dataclass(frozen=True)
class Shape:
    """How one batch's generation is spread: the batch as the trainer takes it, the rollout
    replicas (each with its `speed`), and how many requests a replica serves per call."""

    batch: int
    """Samples per trainer step."""
    group: int
    """Samples per request (the group size: one prompt, `group` continuations)."""
    speeds: tuple[float, ...]
    """One speed factor per rollout replica."""
    requests_per_call: int
    """Requests a replica fetches and generates together (`rollout.maxBatchSize`)."""
    prompt_tokens: int = 32
    limit: int = 4096
    """Response length cap (`algorithm.maxNewTokens`)."""


def _calls(shape: Shape) -> list[int]:
    """Requests per call when one batch's requests are dealt out in calls of at most
    `requests_per_call`, round-robin over the replicas (call i on replica i mod R)."""
    requests = math.ceil(shape.batch / shape.group)
    full, rest = divmod(requests, shape.requests_per_call)
    return [shape.requests_per_call] * full + ([rest] if rest else [])


def _call_seconds(
    model: LatencyModel, shape: Shape, requests: int, speed: float, rng: random.Random
) -> float:
    lengths = [model.length(rng, shape.limit) for _ in range(requests * shape.group)]
    return model.seconds(requests * shape.prompt_tokens, lengths, speed)


def expected_times(
    model: LatencyModel, shape: Shape, *, trials: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """(sync makespan, pipelined seconds) of one batch's generation, by Monte Carlo.

    Sync: the batch's calls start together on the replicas (call i on replica i mod R, one
    after the other there); the batch is done when the last replica is. Pipelined: every
    replica always busy, so a batch costs its calls' total time over the replicas' total
    speed; the long tail still counts inside each call, but no replica waits for another."""
    rng = random.Random(seed)
    calls, replicas = _calls(shape), len(shape.speeds)
    makespans, pipelined = [], []
    for _ in range(trials):
        busy = [0.0] * replicas
        work = 0.0
        for i, requests in enumerate(calls):
            speed = shape.speeds[i % replicas]
            seconds = _call_seconds(model, shape, requests, speed, rng)
            busy[i % replicas] += seconds
            work += seconds * speed  # in replica-seconds at speed 1
        makespans.append(max(busy))
        pipelined.append(work / sum(shape.speeds))
    return statistics.fmean(makespans), statistics.fmean(pipelined)


def ideal_speedup(t_sync_gen: float, t_pipelined_gen: float, t_train: float) -> float:
    """What perfect overlap could give over sync: (E[makespan] + t_train) over
    max(E[pipelined generation], t_train)."""
    return (t_sync_gen + t_train) / max(t_pipelined_gen, t_train)


def expected_batch_tokens(
    model: LatencyModel, shape: Shape, *, trials: int = 200, seed: int = 1
) -> float:
    """Mean tokens (prompt and response) of one batch under the model."""
    rng = random.Random(seed)
    each = [
        sum(shape.prompt_tokens + model.length(rng, shape.limit) for _ in range(shape.batch))
        for _ in range(trials)
    ]
    return statistics.fmean(each)
