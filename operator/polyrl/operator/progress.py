"""A policy's progress and time left, for status and `kubectl get` (pure functions).

Progress is trainer steps done of the policy's budget (its `trainer.steps`, else the job's
`stop.steps`); the time left is the steps left times the trainer's recent seconds per step
(its heartbeat's `step_seconds`, smoothed by the trainer). Without a budget there is neither;
without a step time yet, no ETA.
"""

from __future__ import annotations


def progress(step: int, budget: int | None) -> str | None:
    """ "90/200 (45%)", or None without a budget."""
    if not budget:
        return None
    done = min(step, budget)
    return f"{done}/{budget} ({100 * done // budget}%)"


def seconds_left(
    step: int, budget: int | None, step_seconds: float | None, *, completed: bool
) -> float | None:
    """Seconds left (0 once done); None without a budget or a step time."""
    if completed or (budget and step >= budget):
        return 0.0
    if not budget or not step_seconds:
        return None
    return (budget - step) * step_seconds


def eta(
    step: int, budget: int | None, step_seconds: float | None, *, completed: bool
) -> str | None:
    """ "12m30s" left, "0s" once done; None without a budget or a step time."""
    left = seconds_left(step, budget, step_seconds, completed=completed)
    return None if left is None else duration(left)


def duration(seconds: float) -> str:
    """Like kubectl's ages: 45s, 12m30s, 3h05m, 2d04h."""
    whole = max(0, round(seconds))
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
