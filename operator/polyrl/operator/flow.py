"""How data and weights flow for a policy: the status figures read from heartbeats (pure).

A PolicyGroup shows its trainer's staleness, its running rollout pods' throughput, the queue
they serve and their last weight sync; an RLJob rolls its groups' figures up per policy.
Figures are rounded to what a person reads, so that a status patch goes out when a figure
moves visibly, not at every heartbeat (`report.publish` skips a status that is unchanged).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from polyrl.api.launch import Role
from polyrl.api.messages import Heartbeat
from polyrl.api.status import PolicyGroupStatus


def group_figures(beats: Iterable[Heartbeat], running: Collection[str]) -> dict[str, Any]:
    """A group's flow figures from its workers' heartbeats; `running`: the names of its
    active rollout pods (heartbeats of pods gone stay in the hub, and must not count)."""
    beats = list(beats)
    figures: dict[str, Any] = {}
    trainers = [hb for hb in beats if hb.role == Role.TRAINER.value]
    if trainers and trainers[0].staleness_p50 is not None:
        figures["staleness_p50"] = trainers[0].staleness_p50
        figures["staleness_p95"] = trainers[0].staleness_p95
    if trainers and trainers[0].is_deviation is not None:
        figures["is_deviation"] = float(f"{trainers[0].is_deviation:.2g}")
    if trainers and trainers[0].clip_fraction is not None:
        figures["clip_percent"] = float(f"{100 * trainers[0].clip_fraction:.2g}")
    rollouts = [hb for hb in beats if hb.role == Role.ROLLOUT.value and hb.pod in running]
    figures["tokens_per_second"] = _rounded(sum(hb.tokens_per_second for hb in rollouts))
    depths = [hb.queue_depth for hb in rollouts if hb.queue_depth is not None]
    figures["queue_depth"] = max(depths) if depths else None
    synced = [hb for hb in beats if hb.role == Role.ROLLOUT.value and hb.sync_seconds is not None]
    if synced:
        figures |= _sync(max(synced, key=lambda hb: hb.at))
    return figures


def dropped_episodes(beats: Iterable[Heartbeat]) -> dict[str, dict[str, int]]:
    """Episodes the workflow runners dropped whole, by policy (`-`: none named) and reason,
    summed over the runners' heartbeats (each runner counts its own)."""
    out: dict[str, dict[str, int]] = {}
    for beat in beats:
        if beat.role != Role.WORKFLOW.value:
            continue
        for policy, reasons in (beat.dropped_episodes or {}).items():
            mine = out.setdefault(policy, {})
            for reason, count in reasons.items():
                mine[reason] = mine.get(reason, 0) + count
    return out


def totals(by_policy: dict[str, dict[str, int]]) -> dict[str, int] | None:
    """`dropped_episodes`' counts by reason alone; None where there are none."""
    out: dict[str, int] = {}
    for reasons in by_policy.values():
        for reason, count in reasons.items():
            out[reason] = out.get(reason, 0) + count
    return dict(sorted(out.items())) or None


def _sync(beat: Heartbeat) -> dict[str, Any]:
    changed = beat.changed_fraction
    return {
        "sync_seconds": round(beat.sync_seconds or 0.0, 2),
        "sync_bytes": beat.sync_bytes,
        "changed_percent": None if changed is None else float(f"{100 * changed:.3g}"),
    }


def policy_figures(
    groups: Sequence[PolicyGroupStatus], owned: PolicyGroupStatus | None
) -> dict[str, Any]:
    """A policy's figures over its groups: staleness and queue from the group with the
    trainer, throughput summed, and the slowest group's last weight sync (remote pools
    sync over the slowest links; that is the figure to watch)."""
    figures: dict[str, Any] = {}
    if owned is not None:
        figures |= {
            k: getattr(owned, k)
            for k in ("staleness_p50", "staleness_p95", "is_deviation", "clip_percent")
        }
    rates = [g.tokens_per_second for g in groups if g.tokens_per_second is not None]
    figures["tokens_per_second"] = _rounded(sum(rates)) if rates else None
    depths = [g.queue_depth for g in groups if g.queue_depth is not None]
    figures["queue_depth"] = max(depths) if depths else None
    synced = [g for g in groups if g.sync_seconds is not None]
    if synced:
        slowest = max(synced, key=lambda g: g.sync_seconds or 0.0)
        figures |= {k: getattr(slowest, k) for k in ("sync_seconds", "sync_bytes")}
        figures["changed_percent"] = slowest.changed_percent
    return figures


def _rounded(value: float) -> float:
    """Three significant figures: 1234.5 -> 1230.0, 12.345 -> 12.3."""
    return float(f"{value:.3g}")
