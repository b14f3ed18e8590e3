"""Prometheus metrics of the operator (served by `polyrl operator --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

API_REQUESTS = Counter(
    "polyrl_operator_api_requests_total", "Kubernetes API requests made by the operator", ["verb"]
)
RECONCILE_SECONDS = Histogram(
    "polyrl_operator_reconcile_seconds",
    "Time of one reconcile pass",
    ["kind"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
)
RECONCILES = Counter("polyrl_operator_reconciles_total", "Reconcile passes", ["kind"])
PODS = Gauge("polyrl_operator_pods", "Managed pods by role and phase", ["role", "phase"])
DRAINS = Counter("polyrl_operator_drains_total", "Rollout pods drained", ["outcome"])
