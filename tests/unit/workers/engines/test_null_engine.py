"""The benchmark engine: canned generations behind the real engine interface."""

from __future__ import annotations

import pytest
import torch

from polyrl.workers.rollout.engines.base import Engine, SamplingParams
from polyrl.workers.rollout.engines.null_engine import CANNED_LOGPROB, NullEngine


def test_it_is_an_engine_and_answers_every_prompt_with_the_tokens_asked_for() -> None:
    engine = NullEngine(token=7)
    assert isinstance(engine, Engine)
    out = engine.generate([[1, 2], [3]], SamplingParams(max_new_tokens=5, temperature=0.7))
    assert [g.tokens for g in out] == [[7] * 5, [7] * 5]
    assert all(g.logprobs == [CANNED_LOGPROB] * 5 for g in out)
    assert {g.finish_reason for g in out} == {"length"}
    assert engine.generated == 2


def test_it_refuses_an_empty_prompt_and_counts_weight_loads() -> None:
    engine = NullEngine()
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingParams(max_new_tokens=1))
    engine.load_weights({"w": torch.zeros(2)})
    assert (engine.loads, engine.weights(), engine.weights_are_live) == (1, {}, False)
