"""The quick forms of `polyrl bench pipeline --simulated` and `polyrl bench scale`: every
figure is there and sane. (The benchmarks' full forms are recorded in docs/benchmarks.md.)"""

from __future__ import annotations

import pytest

from polyrl.bench import pipeline, scale

pytestmark = pytest.mark.slow


def test_the_simulated_pipeline_grid_measures_async_against_sync_beside_the_ideal() -> None:
    figures = pipeline.run(quick=True, simulated=True)
    assert figures["simulated"] is True
    cells = figures["cells"]
    assert [(c["tail"], c["ratio"], c["hardware"]) for c in cells] == [
        ("light", 1.0, "uniform"),
        ("heavy", 1.0, "uniform"),
    ]
    for c in cells:
        assert c["t_makespan"] > c["t_gen"] > 0
        assert c["ideal_speedup"] > 1
        # async overlaps generation and training, sync cannot: that much holds under any load
        assert c["async_vs_sync_speedup"] > 1, c
        assert c["sync_mean_staleness"] == 0
        assert c["sync_stale_dropped"] == 0
    heavy = cells[1]
    assert heavy["ideal_speedup"] > cells[0]["ideal_speedup"]  # the tail's share, modelled
    assert len(heavy["async_series"]) == figures["steps"]
    assert heavy["async_series"][-1][1] == figures["steps"] * figures["batch"]


def test_the_scale_benchmark_reports_rate_cost_fairness_and_the_limit_per_replica_count() -> None:
    figures = scale.run(quick=True)
    rows = figures["rows"]
    assert [r["replicas_per_policy"] for r in rows] == [1, 4]
    for row in [*rows, figures["largest_awaited_publishes"], figures["largest_two_runners"]]:
        assert 0 < row["samples_per_s"] <= 1.2 * row["capacity_samples_per_s"], row
        assert row["orchestration_us_per_sample"] > 0
        assert row["fairness_max_over_min"] is not None, row
        assert row["episodes_failed"] == 0
        assert row["saturated"]
    assert figures["largest_two_runners"]["runners"] == 2
    assert figures["window_over_awaited"] > 0
