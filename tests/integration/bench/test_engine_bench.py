"""`polyrl bench engine --quick` runs end to end and reports the figures docs/benchmarks.md uses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from polyrl.bench import engine as bench
from polyrl.bench import engine_vllm


@pytest.mark.slow
def test_the_quick_engine_benchmark_compares_float32_and_bfloat16_arithmetic() -> None:
    figures = bench.arithmetic(quick=True)
    assert figures["batch"] == bench.PROMPTS * bench.GROUP
    # Every sample writes at least its first token and at most NEW_TOKENS.
    assert figures["batch"] <= figures["new_tokens"] <= figures["batch"] * bench.NEW_TOKENS
    for key in ["seconds_float32", "seconds_bfloat16", "float32_vs_bfloat16"]:
        assert isinstance(figures[key], float), key
        assert figures[key] > 0, key
    ratio = figures["seconds_bfloat16"] / figures["seconds_float32"]
    assert figures["float32_vs_bfloat16"] == pytest.approx(ratio, rel=0.02)
    # The same bfloat16 weights: the two arithmetics differ only by rounding.
    assert 0 < figures["logprob_max_diff"] < 0.1


@pytest.mark.vllm_slow  # half a minute of vLLM start-up: `make test-vllm`
def test_the_quick_engine_benchmark_compares_the_torch_and_vllm_engines() -> None:
    figures = bench.against_vllm(quick=True)
    assert figures["vllm_measured"], "no vLLM environment: run `make install-vllm`"
    for engine in ("torch", "vllm"):
        for key in ("import_s", "load_s", "first_token_s", "tokens_per_s"):
            assert figures[f"{engine}_{key}"] > 0, (engine, key)
        # Both engines compute in float32 here: their log-probs are the trainer's.
        assert figures[f"{engine}_logprob_max_diff"] <= 1e-3, engine
    ratio = figures["vllm_tokens_per_s"] / figures["torch_tokens_per_s"]
    assert figures["vllm_vs_torch_tokens_per_s"] == pytest.approx(ratio, abs=0.01)


@pytest.mark.vllm_slow  # a minute of the torch side of a torch-vs-vLLM bench: `make test-vllm`
def test_the_engine_benchmark_on_a_model_directory_measures_each_dtype_and_batch_size(
    tiny_bpe: Callable[[str], Path], tmp_path: Path
) -> None:
    """`--model` without a vLLM environment: the torch engine's figures per compute dtype
    and batch size, and its log-prob gap to the float32 trainer, on a chat model."""
    figures = engine_vllm.model_matrix(None, tiny_bpe("llama"), workdir=tmp_path, quick=True)
    assert figures["vllm_measured"] is False
    for dtype in engine_vllm.DTYPES:
        for batch in engine_vllm.BATCHES:
            assert figures[f"torch_{dtype}_b{batch}_tokens_per_s"] > 0
            assert figures[f"torch_{dtype}_b{batch}_first_token_s"] > 0
    assert figures["torch_float32_logprob_max_diff"] <= 1e-4
    assert 0 < figures["torch_bfloat16_logprob_max_diff"] < 0.5
