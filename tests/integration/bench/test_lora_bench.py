"""`polyrl bench lora --quick` runs end to end on the tiny model and reports every figure
docs/benchmarks.md's LoRA table uses, with the relations that hold at any model size."""

from __future__ import annotations

import pytest

from polyrl.bench import lora as bench


@pytest.mark.slow
def test_the_quick_lora_benchmark_reports_memory_time_and_bytes_for_every_configuration() -> None:
    figures = bench.run(quick=True)
    for name in ("full", "lora_r8", "lora_r16"):
        for key in ("peak_rss_gb", "step_s", "model_bytes", "model_delta_bytes"):
            assert figures[f"{name}_{key}"] > 0, (name, key)
    for name in ("lora_r8", "lora_r16"):
        # The adapter is a fraction of the model; its delta a fraction of the merged delta.
        assert figures[f"{name}_adapter_bytes"] < figures["full_model_bytes"] / 2
        assert figures[f"{name}_adapter_delta_bytes"] < figures[f"{name}_model_delta_bytes"]
        assert figures[f"{name}_trainable_params"] < figures["full_trainable_params"] / 2
    assert figures["lora_r8_adapter_bytes"] < figures["lora_r16_adapter_bytes"]
    # Two policies on one engine hold one base: about one pool's memory, not two.
    assert figures["shared_vs_one_pool_memory"] <= 1.15
    assert figures["serve_shared_switch_s"] > 0
    assert figures["serve_one_switch_s"] == 0
