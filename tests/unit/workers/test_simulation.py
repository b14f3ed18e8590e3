"""The latency model simulated replicas and trainers take their time from, and the ideal
speedup `polyrl bench pipeline --simulated` measures against (`runtime.simulation`)."""

from __future__ import annotations

import random

import pytest

from polyrl.workers.runtime.simulation import (
    LatencyModel,
    Shape,
    TrainCost,
    expected_batch_tokens,
    expected_times,
    ideal_speedup,
)


def shape(speeds: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0), limit: int = 4096) -> Shape:
    return Shape(batch=128, group=8, speeds=speeds, requests_per_call=4, prompt_tokens=10,
                 limit=limit)  # fmt: skip


def test_without_a_tail_every_response_has_the_median_length_within_the_limit() -> None:
    model = LatencyModel(median_tokens=100, tail=0.0)
    rng = random.Random(0)
    assert {model.length(rng, 4096) for _ in range(50)} == {100}
    assert model.length(rng, 30) == 30


def test_a_heavy_tail_has_longer_long_responses_and_none_beyond_the_limit() -> None:
    rng = random.Random(1)
    light = sorted(LatencyModel(tail=0.3).length(rng, 4096) for _ in range(2000))
    heavy = sorted(LatencyModel(tail=1.0).length(rng, 4096) for _ in range(2000))
    p99 = int(0.99 * len(light))
    assert heavy[p99] > 2 * light[p99]
    assert max(heavy) <= 4096
    assert min(heavy) >= 1


def test_a_call_lasts_as_long_as_its_longest_sequence_and_a_slow_replica_longer() -> None:
    model = LatencyModel(prefill=0.01, decode=0.1, overhead=1.0)
    assert model.seconds(20, [3, 50, 7]) == pytest.approx(1.0 + 0.2 + 5.0)
    assert model.seconds(20, [3, 50, 7], speed=0.5) == pytest.approx(2 * 6.2)


def test_the_trainers_step_grows_with_the_batch_tokens() -> None:
    cost = TrainCost(fixed=2.0, per_token=0.001)
    assert cost.seconds(1000) == pytest.approx(3.0)


def test_without_a_tail_sync_and_pipelined_generation_take_the_same_time() -> None:
    model = LatencyModel(decode=0.05, median_tokens=200, tail=0.0)
    makespan, pipelined = expected_times(model, shape(), trials=20)
    assert makespan == pytest.approx(pipelined)
    # one call of 4 requests per replica: prefill of 40 tokens, 200 decoding steps
    assert makespan == pytest.approx(model.seconds(40, [200]))


def test_the_tail_makes_the_sync_makespan_longer_than_pipelined_generation() -> None:
    light = expected_times(LatencyModel(tail=0.3), shape(), trials=300)
    heavy = expected_times(LatencyModel(tail=1.0), shape(), trials=300)
    assert light[0] > light[1]
    assert heavy[0] / heavy[1] > light[0] / light[1]


def test_a_slow_replica_holds_up_a_sync_batch_more_than_a_pipelined_one() -> None:
    model = LatencyModel(tail=0.0)
    even = expected_times(model, shape((1.0, 1.0, 1.0, 1.0)), trials=5)
    mixed = expected_times(model, shape((1.0, 1.0, 1.0, 0.25)), trials=5)
    assert mixed[0] == pytest.approx(4 * even[0])  # the batch waits for the slow one
    assert mixed[1] == pytest.approx(4 / 3.25 * even[1])  # pipelined: its share of work


def test_the_ideal_speedup_is_full_overlap_over_sync() -> None:
    assert ideal_speedup(10.0, 10.0, 10.0) == pytest.approx(2.0)
    assert ideal_speedup(15.0, 10.0, 10.0) == pytest.approx(2.5)
    assert ideal_speedup(15.0, 10.0, 40.0) == pytest.approx(55 / 40)


def test_expected_batch_tokens_counts_prompts_and_responses() -> None:
    tokens = expected_batch_tokens(LatencyModel(median_tokens=50, tail=0.0), shape(), trials=3)
    assert tokens == pytest.approx(128 * (10 + 50))


def test_a_model_with_negative_costs_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        LatencyModel(decode=-1.0)
    with pytest.raises(ValueError, match="median_tokens"):
        LatencyModel(median_tokens=0)
