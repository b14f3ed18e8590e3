"""`polyrl bench delta --quick` runs end to end and reports every figure docs/benchmarks.md uses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from polyrl.bench import delta as bench

RATIOS = [
    "changed_fraction",
    "bytes_per_changed_element",
    "ratio_vs_full",
    "ratio_vs_coo",
    "encode_vs_copy",
    "apply_vs_copy",
    "objstore_vs_pull",
    "sync_full_s",
    "sync_delta_s",
    "shaped_sync_full_s",
    "shaped_sync_delta_s",
]


@pytest.mark.slow
async def test_the_quick_delta_benchmark_reports_every_headline_figure() -> None:
    # The benchmark runs its own event loop (asyncio.run), so it gets a thread of its own.
    figures = await asyncio.to_thread(bench.run, quick=True)
    for key in RATIOS:
        assert isinstance(figures[key], float), key
        assert figures[key] > 0, key
    for key in ["changed_fraction", "bytes_per_changed_element", "ratio_vs_full", "ratio_vs_coo"]:
        assert isinstance(figures[f"{key}_lr1e5"], float), key
    assert figures["training_bit_identical"] is True
    assert figures["training_bit_identical_lr1e5"] is True
    assert figures["quick"] is True
    assert figures["train_step_s"] > 0
    assert figures["train_step_encode_s"] > 0
    assert isinstance(figures["encode_share_of_step"], float)  # noise can make it negative
    assert isinstance(figures["encode_share_of_step_all_threads"], float)
    assert isinstance(figures["encode_share_of_step_thread"], float)
    assert figures["train_step_threads"] == 1  # the trainer's default, POLYRL_TORCH_THREADS
    assert figures["train_step_all_threads_s"] > 0
    assert isinstance(figures["shaped_link"], str)


@pytest.mark.slow
async def test_the_delta_benchmark_on_a_model_directory_measures_its_rl_steps(
    tiny_bpe: Callable[[str], Path],
) -> None:
    """`--model`: GRPO steps of a chat model (here a tiny one) at both learning rates, each
    step's delta applied bit for bit, and the last one synced over both links."""
    model = tiny_bpe("llama")
    figures = await asyncio.to_thread(bench.run, quick=True, model=model)
    assert figures["model"] == str(model)
    for suffix in ("", "_lr1e5"):
        assert figures[f"bit_identical{suffix}"] is True
        steps = figures[f"changed_fraction_per_step{suffix}"]
        assert len(steps) == figures["rl_steps"] == 3
        assert all(0 <= fraction <= 1 for fraction in steps)
        assert figures[f"delta_vs_full_bf16{suffix}"] > 0
        assert len(figures[f"mean_reward_per_step{suffix}"]) == 3
    for key in ("sync_full_s", "sync_delta_s", "shaped_sync_full_s", "shaped_sync_delta_s"):
        assert figures[key] > 0, key
    assert figures["keyframe_bytes"] > figures["delta_bytes"] > 0
