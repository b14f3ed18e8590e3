"""Prometheus metrics of the operator (served by `polyrl operator --metrics-port`)."""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable
from typing import Protocol

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


class _Pod(Protocol):
    role: str
    phase: str


# What each group or job loop saw last, so the gauge is the sum over all of them; labels that
# no loop sees any more are set to 0, not left at their last count.
_pods_by_owner: dict[Hashable, collections.Counter[tuple[str, str]]] = {}
_pod_labels: set[tuple[str, str]] = set()


def observe_pods(owner: Hashable, pods: Iterable[_Pod]) -> None:
    """The pods one reconcile loop manages now (a group's, or a job's workflow runners)."""
    _pods_by_owner[owner] = collections.Counter((pod.role, pod.phase) for pod in pods)
    _refresh_pods()


def forget_pods(owner: Hashable) -> None:
    """A loop that stopped (its resource deleted) manages no pods any more."""
    if _pods_by_owner.pop(owner, None) is not None:
        _refresh_pods()


def _refresh_pods() -> None:
    totals: collections.Counter[tuple[str, str]] = collections.Counter()
    for counts in _pods_by_owner.values():
        totals.update(counts)
    for labels in _pod_labels - set(totals):
        PODS.labels(*labels).set(0)
    for labels, count in totals.items():
        PODS.labels(*labels).set(count)
    _pod_labels.update(totals)
