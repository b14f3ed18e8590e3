"""The simulated engine: modelled lengths and time behind the real engine interface, without
torch (`rollout.engines.simulated_engine`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from polyrl.workers.rollout.engines.base import Engine, GeneratesAsync, SamplingParams
from polyrl.workers.rollout.engines.simulated_engine import SimulatedEngine
from polyrl.workers.runtime.simulation import LatencyModel

STOP = 2


def test_it_is_an_engine_that_generates_on_the_event_loop() -> None:
    engine = SimulatedEngine(LatencyModel())
    assert isinstance(engine, Engine)
    assert isinstance(engine, GeneratesAsync)


def test_responses_have_the_modelled_lengths_and_the_short_ones_end_with_a_stop_token() -> None:
    engine = SimulatedEngine(LatencyModel(median_tokens=20, tail=1.0), compression=1e9, seed=3)
    params = SamplingParams(max_new_tokens=30, stop_token_ids=(STOP,))
    out = engine.generate([[1, 2, 3]] * 200, params)
    assert len(out) == 200
    for g in out:
        assert 1 <= len(g.tokens) == len(g.logprobs) <= 30
        if g.finish_reason == "stop":
            assert g.tokens[-1] == STOP
            assert len(g.tokens) < 30
        else:
            assert len(g.tokens) == 30
            assert STOP not in g.tokens
    assert {g.finish_reason for g in out} == {"stop", "length"}


def test_the_modelled_time_is_the_latency_models_for_the_lengths_generated() -> None:
    model = LatencyModel(prefill=0.5, decode=0.25, overhead=1.0, median_tokens=8, tail=0.0)
    engine = SimulatedEngine(model, speed=2.0, compression=1e9)
    engine.generate([[1, 2], [3, 4]], SamplingParams(max_new_tokens=100))
    assert engine.modelled == pytest.approx((1.0 + 0.5 * 4 + 0.25 * 8) / 2.0)
    assert (engine.calls, engine.sequences) == (1, 2)


async def test_the_same_seed_gives_the_same_lengths_sync_or_async() -> None:
    params = SamplingParams(max_new_tokens=500)
    one = SimulatedEngine(LatencyModel(tail=1.0), compression=1e9, seed=7)
    two = SimulatedEngine(LatencyModel(tail=1.0), compression=1e9, seed=7)
    a = [len(g.tokens) for g in one.generate([[1]] * 16, params)]
    b = [len(g.tokens) for g in await two.agenerate([[1]] * 16, params)]
    assert a == b
    assert len(set(a)) > 1


def test_it_refuses_an_empty_prompt_and_a_speed_of_zero() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        SimulatedEngine(LatencyModel()).generate([[]], SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError, match="> 0"):
        SimulatedEngine(LatencyModel(), speed=0.0)


def test_simulated_replicas_trainers_and_jobs_import_no_torch() -> None:
    modules = [
        "polyrl.workers.rollout.engines.simulated_engine",
        "polyrl.workers.rollout.worker",
        "polyrl.workers.rollout.announced",
        "polyrl.workers.trainer.simulated",
        "polyrl.workers.runner.main",
        "polyrl.bench.simulation",
    ]
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules)
    code += "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
