"""`polyrl bench operator --json --quick` runs end to end and reports every figure.

The benchmark starts its own control plane, nats-server and operator, so this test uses
none of the session fixtures. It checks the shape and sanity of the figures, not the
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
    assert isinstance(figures["api_requests_per_reconcile"], float)
    assert figures["api_requests_per_reconcile"] > 0  # pods were created by the operator
    assert 0 <= figures["idle_cpu_percent"] <= 100 * (figures["cpus"] or 1)
    assert 20 < figures["idle_rss_mb"] < 4096
    assert figures["idle_api_requests_per_s"] >= 0
    assert figures["idle_jobs"] == operator_bench.config(quick=True).idle_jobs
    assert figures["idle_reconciles_per_s"] >= 0  # the 30 s resync may fall outside the window
    assert figures["status_interval_s"] > 0
    # A real job's new rollout pods Run at once and are Ready once they serve, later.
    assert figures["serving_scale_step"] == operator_bench.config(quick=True).serving_step
    assert 0 < figures["scale_up_to_running_s"] < figures["scale_up_to_serving_s"] < 600
    assert figures["serving_job_running_s"] > 0
    assert "[bench operator" in proc.stderr  # progress goes to stderr
    print(f"quick benchmark took {elapsed:.0f}s: {json.dumps(figures, sort_keys=True)}")
