"""`polyrl bench operator --json --quick` runs end to end and reports every figure.

The benchmark starts its own control plane, nats-server and operator, so this test uses
none of the session fixtures. It checks the figures' shape, exact counts and the relations
between them (a median under its p99, a rate that is its count over its window), not the
targets: timings belong in docs/benchmarks.md, not in pass/fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polyrl.bench import operator as operator_bench

REPO = Path(__file__).resolve().parents[3]

TIMES = (
    "apply_to_pods_median_s",
    "scale_up_median_s",
    "scale_up_p99_s",
    "scale_down_median_s",
)


@pytest.mark.slow
def test_bench_operator_quick_reports_every_figure() -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "bench", "operator", "--json", "--quick"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(proc.stdout)  # stdout is exactly one JSON object

    assert figures["quick"] is True
    for key in TIMES:
        assert isinstance(figures[key], float), key
        assert 0 < figures[key] < 60, (key, figures[key])
    assert figures["scale_up_median_s"] <= figures["scale_up_p99_s"]
    assert figures["scale_down_median_s"] <= figures["scale_down_p99_s"]
    assert figures["apply_to_pods_median_s"] <= figures["apply_to_pods_max_s"]
    cfg = operator_bench.config(quick=True)
    # Exact counts: 2 policies of 1 trainer and 1 rollout each, and 1 workflow runner.
    assert figures["pods_per_job"] == 5
    assert figures["idle_jobs"] == cfg.idle_jobs
    assert figures["idle_pods"] == cfg.idle_jobs * 5
    # The operator's own counters: every pod it made is a create it counted, every pod it
    # scaled away a delete; and the figure per reconcile is their quotient.
    active = figures["active_api_requests_by_verb"]
    made = cfg.apply_jobs * 5 + cfg.scale_repeats * figures["scale_step"]
    assert active["create"] >= made, (active, made)
    assert active["delete"] >= cfg.scale_repeats * figures["scale_step"], active
    assert figures["api_requests_per_reconcile"] == pytest.approx(
        sum(active.values()) / figures["active_reconciles"], abs=0.001
    )
    # Idle: the per-second figures are the window's counts over its length.
    window = figures["idle_window_s"]
    assert window >= cfg.idle_window_s
    idle_requests = sum(figures["idle_api_requests_by_verb"].values())
    assert figures["idle_api_requests_per_s"] == pytest.approx(
        idle_requests / window, rel=0.002, abs=0.001
    )
    passes = figures["idle_reconciles_per_s"] * window  # the 30 s resync may fall outside it
    assert passes == pytest.approx(round(passes), abs=0.1)  # whole passes
    # An idle operator, one asyncio loop, busy for less than a core; its memory now is no
    # more than its peak.
    assert figures["idle_cpu_percent"] < 100
    assert 20 < figures["idle_rss_mb"] <= figures["peak_rss_mb"]
    assert figures["status_interval_s"] > 0
    # A real job's new rollout pods Run at once and are Ready once they serve, later.
    assert figures["serving_scale_step"] == operator_bench.config(quick=True).serving_step
    assert 0 < figures["scale_up_to_running_s"] < figures["scale_up_to_serving_s"] < 600
    assert figures["serving_job_running_s"] > 0
    assert "[bench operator" in proc.stderr  # progress goes to stderr
    print(f"quick benchmark took {elapsed:.0f}s: {json.dumps(figures, sort_keys=True)}")
