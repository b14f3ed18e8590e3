"""`polyrl bench trainer --quick` runs end to end on the tiny model and reports every figure
docs/benchmarks.md's packing table uses, with the relations that hold at any model size."""

from __future__ import annotations

import pytest

from polyrl.bench import trainer as bench


@pytest.mark.slow
def test_the_quick_trainer_benchmark_reports_padded_and_packed_figures_on_the_same_batch() -> None:
    figures = bench.run(quick=True)
    for mode in ("padded", "packed"):
        for key in ("step_s", "tokens_per_second", "peak_rss_gb"):
            assert figures[f"{mode}_{key}"] > 0, (mode, key)
        # The same batch both ways: the same real tokens, the two paths' log-probs agree.
        assert figures[f"{mode}_tokens"] == figures["padded_tokens"]
        assert figures[f"{mode}_logprob_max_abs_diff_packed_vs_padded"] < 1e-4
    # The lengths have a long tail: padding micro-batches of 8 wastes a good share.
    assert figures["padded_padding_share_if_padded"] > 0.2
    assert figures["packed_vs_padded_tokens_per_second"] == pytest.approx(
        figures["packed_tokens_per_second"] / figures["padded_tokens_per_second"], abs=1e-3
    )
