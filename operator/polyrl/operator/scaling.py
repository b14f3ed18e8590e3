"""Pure decisions about a rollout pool: which indices to fill, which pods to drain, backoff.

Scale-down order is deterministic and documented: pods that are not Ready go first (they
serve nothing), then the newest (they hold the least warm state), ties broken by the
highest replica index. Scale-up fills the lowest free indices, so names stay small and a
restarted operator computes the same names again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from polyrl.api.base import seconds_since
from polyrl.operator.podinfo import PodInfo

BACKOFF_BASE = 1.0
BACKOFF_MAX = 300.0


def victims(active: Sequence[PodInfo], count: int) -> list[PodInfo]:
    """The `count` pods to drain first: not-Ready first, then newest, then highest index."""
    if count <= 0:
        return []
    order = sorted(active, key=lambda p: (p.ready, _neg(p.created), -p.replica))
    return order[:count]


def _neg(stamp: str) -> tuple[int, ...]:
    """Sort key that orders RFC 3339 stamps newest first."""
    return tuple(-ord(ch) for ch in stamp)


def queued_victims(active: Sequence[PodInfo], count: int, slots: int) -> list[PodInfo]:
    """As `victims`, for a pool whose first `slots` indices belong to a Kueue gang: pods
    above them go first, so the gang keeps its members (admitted together, they are never
    the ones scaled away while others remain)."""
    elastic = [p for p in active if p.replica >= slots]
    chosen = victims(elastic, count)
    return chosen + victims([p for p in active if p.replica < slots], count - len(chosen))


def queued_indices(pods: Sequence[PodInfo], desired: int, slots: int) -> list[int]:
    """The indices to create for a pool whose first `slots` indices belong to a Kueue gang:
    a missing gang index is made again under its own index (so its pod rejoins the gang),
    and waited for while the pod that held it is still going away (another index would
    make it a Workload of its own while the gang lacked a member); the rest fill the lowest
    free indices above the gang's."""
    held = {p.replica for p in pods}
    active = [p for p in pods if p.active]
    gang = [i for i in range(min(slots, desired)) if i not in held]
    wanted = max(0, desired - slots) - len([p for p in active if p.replica >= slots])
    above = [i + slots for i in free_indices((r - slots for r in held if r >= slots), wanted)]
    return gang + above


def free_indices(used: Iterable[int], count: int) -> list[int]:
    taken, i = set(used), 0
    found: list[int] = []
    while len(found) < count:
        if i not in taken:
            found.append(i)
        i += 1
    return found


def backoff_over(last_failure: str | None, failures: int) -> bool:
    """True once the backoff after `failures` consecutive failures (the last at
    `last_failure`, RFC 3339) has passed."""
    if not last_failure or failures <= 0:
        return True
    return seconds_since(last_failure) >= backoff_delay(failures)


def backoff_delay(failures: int) -> float:
    """Seconds to wait before replacing a pod after `failures` consecutive failures."""
    if failures <= 0:
        return 0.0
    return float(min(BACKOFF_MAX, BACKOFF_BASE * 2.0 ** (failures - 1)))
