"""Prometheus metrics of the operator (served by `polyrl operator --metrics-port`)."""

from __future__ import annotations

import collections
import time
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
RECONCILE_ERRORS = Counter(
    "polyrl_operator_reconcile_errors_total",
    "Reconcile passes that raised (logged, and retried on the next wake)",
    ["kind"],
)
PODS = Gauge("polyrl_operator_pods", "Managed pods by role and phase", ["role", "phase"])
DRAINS = Counter("polyrl_operator_drains_total", "Rollout pods drained", ["outcome"])
SCALE_SECONDS = Histogram(
    "polyrl_operator_scale_seconds",
    "From a PolicyGroup's rollout replica count changing to that many pods ready, none draining",
    ["direction"],
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)


class _Pod(Protocol):
    role: str
    phase: str


class _Rollout(Protocol):
    role: str
    active: bool
    ready: bool
    draining: bool


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
    SCALING.forget(owner)
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


class ScaleClock:
    """Times each change of a group's replica count until the pool has settled on it: that
    many rollout pods ready and none draining. A change made before the last one settled
    restarts the clock (it is the new count that is waited for). The first count seen (a
    new group, or an operator restart) is a start only where it has not settled yet."""

    def __init__(self) -> None:
        self.targets: dict[Hashable, int] = {}
        self.started: dict[Hashable, tuple[float, str]] = {}

    def observe(
        self, owner: Hashable, *, desired: int, settled: bool, now: float
    ) -> tuple[str, float] | None:
        """The (direction, seconds) of a change that settled now; else None."""
        before = self.targets.get(owner)
        self.targets[owner] = desired
        if before != desired and not (before is None and settled):
            self.started[owner] = (now, "up" if desired > (before or 0) else "down")
        if settled and owner in self.started:
            began, direction = self.started.pop(owner)
            return direction, now - began
        return None

    def forget(self, owner: Hashable) -> None:
        self.targets.pop(owner, None)
        self.started.pop(owner, None)


SCALING = ScaleClock()


def observe_scale(owner: Hashable, *, desired: int, pods: Iterable[_Rollout]) -> None:
    """A group's rollout pods as its loop sees them; observes a scale that settled."""
    rollouts = [pod for pod in pods if pod.role == "rollout"]
    active = [pod for pod in rollouts if pod.active]
    settled = (
        len(active) == desired
        and all(pod.ready for pod in active)
        and not any(pod.draining for pod in rollouts)
    )
    done = SCALING.observe(owner, desired=desired, settled=settled, now=time.monotonic())
    if done is not None:
        SCALE_SECONDS.labels(direction=done[0]).observe(done[1])
