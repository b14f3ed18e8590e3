"""The Grafana dashboard in the chart asks only for metrics the code exports, and shows
every figure a worker exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

import polyrl.operator.metrics  # noqa: F401  (registers the operator's metrics)
from polyrl.workers.runtime import prometheus as worker_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "polyrl" / "dashboards" / "polyrl.json"
# What a family of each type is scraped as.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def series(registry: CollectorRegistry) -> set[str]:
    """The sample names a scrape of `registry` can return (`polyrl_*` only)."""
    return {
        family.name + suffix
        for family in registry.collect()
        if family.name.startswith("polyrl_")
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def exported() -> set[str]:
    return series(REGISTRY) | series(worker_metrics.WorkerMetrics("rollout", "p").registry)


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            yield query["query"]


def named(expr: str) -> set[str]:
    return set(re.findall(r"\bpolyrl_[a-z0-9_]+", expr))


def test_every_expression_in_the_dashboard_names_a_metric_the_code_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = list(expressions(dashboard))
    assert len(exprs) >= 25
    known = exported()
    for expr in exprs:
        assert named(expr), f"no polyrl metric in {expr!r}"
        assert named(expr) <= known, f"{expr!r} names {sorted(named(expr) - known)}"


def test_every_worker_figure_and_operator_metric_has_a_panel() -> None:
    shown = set().union(*map(named, expressions(json.loads(DASHBOARD.read_text()))))
    figures = {f"polyrl_worker_{field}" for field in worker_metrics.FIGURES}
    operator = {name for name in series(REGISTRY) if name.startswith("polyrl_operator_")}
    bases = {re.sub(r"_(bucket|sum|count|total)$", "", name) for name in shown}
    assert figures <= shown, sorted(figures - shown)
    assert {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in operator} <= bases


def test_the_known_set_is_not_vacuous() -> None:
    known = exported()
    assert "polyrl_worker_staleness_bucket" in known
    assert "polyrl_operator_scale_seconds_bucket" in known
    assert "polyrl_worker_no_such_metric" not in known
