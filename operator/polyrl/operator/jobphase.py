"""An RLJob's phase and the conditions that go with it: Ready, WorkersHealthy, the end.

A job is Pending until every policy trains and serves and its workflow runners run episodes,
Running from then on (Ready says what is degraded while pods are scaled or replaced), and it
ends, once, when `spec.stop` is met (Succeeded) or a policy's group failed (Failed): then its
pods are freed and its status is kept, saying how it ended as a batch Job does (`end`).
WorkersHealthy gathers the failures of the job's workflow runners and of its groups.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyrl.api.base import (
    ConditionStatus,
    ConditionType,
    find_condition,
    now_rfc3339,
    seconds_since,
)
from polyrl.api.resources import Phase, PolicyGroup, PolicyStatus
from polyrl.operator.jobpass import JobReconcile

# A group's WorkersHealthy reasons that are failures (others say the job is over or paused).
FAILURE_REASONS = ("WorkerFailed", "InvalidInput", "RestartLimitExceeded")


def update(
    p: JobReconcile, groups: Sequence[PolicyGroup], *, ready: bool, runners_ready: bool
) -> None:
    """Pending until every policy trains and serves and the workflow runners run episodes
    (each said so in a heartbeat: the pods' readiness); Running from then on, while pods
    are scaled or replaced (Ready then says what is degraded), until the job ends."""
    phase = Phase(p.status.phase)
    unhealthy = _workers_healthy(p, groups)
    if phase.is_terminal():
        return
    failed = [g for g in groups if g.status.phase == Phase.FAILED and g.spec.trainer is not None]
    all_ready = ready and runners_ready
    started = phase == Phase.RUNNING or (phase == Phase.PENDING and all_ready)
    if failed:
        causes = "; ".join(
            f"{g.metadata.name}: {g.status.last_failure or 'failed'}" for g in failed
        )
        p.status.last_failure = causes
        end(p, Phase.FAILED, "PolicyFailed", f"policy group(s) failed: {causes}")
    elif _stop_reached(p):
        end(p, Phase.SUCCEEDED, "StopReached", _stop_message(p))
    elif p.job.spec.suspend:
        p.status.phase = Phase.SUSPENDED
        p.condition(
            ConditionType.READY, False, "Suspended", "spec.suspend is true; all pods are freed"
        )
    elif unhealthy is not None:
        p.status.phase = Phase.RUNNING if phase == Phase.RUNNING else Phase.PENDING
        p.condition(ConditionType.READY, False, "WorkerFailed", unhealthy)
    else:
        p.status.phase = Phase.RUNNING if started else Phase.PENDING
        p.status.start_time = p.status.start_time or (now_rfc3339() if all_ready else None)
        p.condition(
            ConditionType.READY,
            all_ready,
            "Ready" if all_ready else ("Degraded" if started else "NotReady"),
            _readiness(p, ready=ready, runners_ready=runners_ready),
        )


def _readiness(p: JobReconcile, *, ready: bool, runners_ready: bool) -> str:
    """What Ready says: the policies ready, and what is not yet (or no longer)."""
    waiting = [w for x in p.status.policies if (w := _waiting_for(x))]
    if not runners_ready:
        waiting.append("workflow runners not running episodes yet")
    said = f"{p.status.policies_ready} policies ready"
    return f"{said} ({'; '.join(waiting)})" if waiting else said


def _waiting_for(policy: PolicyStatus) -> str | None:
    parts = [] if policy.trainer_ready else ["trainer not training yet"]
    if policy.ready_rollouts < policy.desired_rollouts:
        parts.append(f"{policy.ready_rollouts}/{policy.desired_rollouts} rollouts serving")
    return f"{policy.name}: {', '.join(parts)}" if parts else None


def _workers_healthy(p: JobReconcile, groups: Sequence[PolicyGroup]) -> str | None:
    """WorkersHealthy on the job: its workflow runners' and its groups' together. Returns
    why it is False, or None. An ended job keeps what it said when it ended."""
    if Phase(p.status.phase).is_terminal():
        return None
    causes = [p.status.last_failure] if p.status.last_failure else []
    for group in groups:
        cond = find_condition(group.status.conditions, ConditionType.WORKERS_HEALTHY)
        failing = cond is not None and cond.reason in FAILURE_REASONS
        if failing and cond is not None and cond.status == ConditionStatus.FALSE:
            causes.append(f"{group.metadata.name}: {cond.message}")
    if not causes:
        p.condition(ConditionType.WORKERS_HEALTHY, True, "Healthy", "no worker pod failed lately")
        return None
    p.condition(ConditionType.WORKERS_HEALTHY, False, "WorkerFailed", "; ".join(causes))
    return "; ".join(causes)


def _stop_reached(p: JobReconcile) -> bool:
    stop = p.job.spec.stop
    if _steps_done(p):
        return True
    if stop.duration_seconds is not None and p.status.start_time:
        return seconds_since(p.status.start_time) >= stop.duration_seconds
    return False


def _steps_done(p: JobReconcile) -> bool:
    """Every policy reached its last step (its own trainer.steps, else stop.steps)."""
    budgets = p.job.spec.all_steps()
    if not budgets:
        return False
    done = {x.name for x in p.status.policies if x.completed}
    steps = {x.name: x.step for x in p.status.policies}
    return all(
        name in done or (name in steps and steps[name] >= last) for name, last in budgets.items()
    )


def _stop_message(p: JobReconcile) -> str:
    budgets = p.job.spec.all_steps()
    if budgets and _steps_done(p):
        if len(set(budgets.values())) == 1:
            return f"every policy reached step {next(iter(budgets.values()))}"
        return (
            "every policy reached its last step ("
            + ", ".join(f"{name} {steps}" for name, steps in budgets.items())
            + ")"
        )
    return f"ran for {p.job.spec.stop.duration_seconds}s"


def end(p: JobReconcile, phase: Phase, reason: str, message: str) -> None:
    """The job ends: Ready False and Stopped True saying why, Complete or Failed True."""
    p.status.phase = phase
    p.status.completion_time = now_rfc3339()
    p.condition(ConditionType.READY, False, reason, message)
    p.condition(ConditionType.STOPPED, True, reason, message)
    # As a batch Job says how it ended: Complete or Failed, True.
    p.condition(
        ConditionType.COMPLETE if phase == Phase.SUCCEEDED else ConditionType.FAILED,
        True,
        reason,
        message,
    )
    if phase == Phase.SUCCEEDED:  # a failure keeps its cause in WorkersHealthy
        p.condition(ConditionType.WORKERS_HEALTHY, False, reason, f"{message}; no pods run")
    p.event(
        "Normal" if phase == Phase.SUCCEEDED else "Warning",
        reason,
        f"job {phase.value}: {message}; pods are freed, status is kept",
    )
