"""`polyrl bench sharding --quick` runs end to end on the tiny model and reports every figure
docs/benchmarks.md's sharding table uses, with the relations that hold at any model size."""

from __future__ import annotations

import pytest

from polyrl.bench import sharding as bench


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quick_sharding_benchmark_reports_what_each_rank_holds_and_a_resharded_resume() -> None:
    figures = bench.run(quick=True)
    for strategy in ("ddp", "fsdp2"):
        for key in (*bench.HELD, "step_s", *bench.PUBLISHED):
            if not key.endswith("rise_gb"):  # a rise can be nil: pages already resident
                assert figures[f"{strategy}_{key}"] > 0, (strategy, key)
    # What is published is the same weights either way: a keyframe of them all, then a
    # delta of what the steps changed (parts carry a header each: a little larger).
    keyframe = figures["fsdp2_vs_ddp_publish_keyframe_bytes"]
    assert 1.0 <= keyframe < 1.1, keyframe
    assert figures["ddp_publish_delta_bytes"] < figures["ddp_publish_keyframe_bytes"]
    # Two ranks, sharded: each holds about half of what a data-parallel rank holds (the
    # tiny model's layers are small against the whole: within 10 % plus one layer's bytes).
    for key in ("parameter_bytes", "gradient_bytes", "optimizer_bytes"):
        assert figures[f"fsdp2_vs_ddp_{key}"] == pytest.approx(0.5, abs=0.1), key
    # The same steps either way, and the 2-rank checkpoint resumed on one rank goes on
    # exactly where the uninterrupted run went.
    assert figures["fsdp2_losses"] == pytest.approx(figures["ddp_losses"], abs=1e-5)
    assert figures["fsdp2_resume_on_1_rank_next_loss_abs_diff"] < 1e-5
    assert figures["fsdp2_checkpoint_save_s"] > 0
    assert figures["fsdp2_resume_on_1_rank_shard_and_load_s"] > 0
