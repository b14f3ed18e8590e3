"""The flow figures a PolicyGroup and an RLJob show (staleness, throughput, queue, weight
sync), and how the operator times a scale, from heartbeats and pods as they come."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY

from polyrl.api.messages import Heartbeat
from polyrl.api.status import PolicyGroupStatus
from polyrl.operator import flow, metrics
from polyrl.operator.metrics import ScaleClock


def beat(pod: str, role: str, at: float = 1.0, **figures: Any) -> Heartbeat:
    return Heartbeat(pod=pod, role=role, policy="solver", at=at, **figures)


def test_a_groups_figures_come_from_its_trainer_and_its_running_rollouts_only() -> None:
    beats = [
        beat(
            "g-trainer-0",
            "trainer",
            staleness_p50=1.0,
            staleness_p95=3.0,
            is_deviation=0.01234,
            clip_fraction=0.0456,
        ),
        beat("g-rollout-0", "rollout", tokens_per_second=1234.5, queue_depth=7),
        beat("g-rollout-1", "rollout", tokens_per_second=100.0, queue_depth=9),
        # gone: its heartbeat is still held, its throughput must not count
        beat("g-rollout-2", "rollout", tokens_per_second=5000.0, queue_depth=99),
    ]
    figures = flow.group_figures(beats, running={"g-rollout-0", "g-rollout-1"})
    assert figures == {
        "staleness_p50": 1.0,
        "staleness_p95": 3.0,
        "is_deviation": 0.012,  # two figures
        "clip_percent": 4.6,
        "tokens_per_second": 1330.0,  # 1334.5 to three figures
        "queue_depth": 9,
    }


def test_the_last_weight_sync_shown_is_the_newest_any_rollout_reported() -> None:
    beats = [
        beat("g-rollout-0", "rollout", at=10.0, sync_seconds=0.5, sync_bytes=10, changed_fraction=0.5),
        beat("g-rollout-1", "rollout", at=20.0, sync_seconds=0.123, sync_bytes=2048,
             changed_fraction=0.01234),
    ]  # fmt: skip
    figures = flow.group_figures(beats, running=set())
    assert figures["tokens_per_second"] == 0.0  # none running now
    assert (figures["sync_seconds"], figures["sync_bytes"], figures["changed_percent"]) == (
        0.12, 2048, 1.23,  # three significant figures: a delta may change 0.001 %
    )  # fmt: skip


def test_a_group_without_heartbeats_shows_no_throughput_and_keeps_no_stale_figures() -> None:
    assert flow.group_figures([], running=set()) == {"tokens_per_second": 0.0, "queue_depth": None}


def test_a_policy_rolls_its_groups_up_with_the_slowest_sync_and_summed_throughput() -> None:
    owned = PolicyGroupStatus(
        staleness_p50=0.0,
        staleness_p95=2.0,
        is_deviation=0.031,
        clip_percent=1.5,
        tokens_per_second=800.0,
        queue_depth=3,
        sync_seconds=0.1,
        sync_bytes=100,
        changed_percent=1.0,
    )
    remote = PolicyGroupStatus(tokens_per_second=450.0, queue_depth=5, sync_seconds=2.5,
                               sync_bytes=120, changed_percent=1.1)  # fmt: skip
    figures = flow.policy_figures([owned, remote], owned)
    assert figures == {
        "staleness_p50": 0.0,
        "staleness_p95": 2.0,
        "is_deviation": 0.031,  # the trainer's group's, like its staleness
        "clip_percent": 1.5,
        "tokens_per_second": 1250.0,
        "queue_depth": 5,
        "sync_seconds": 2.5,
        "sync_bytes": 120,
        "changed_percent": 1.1,
    }
    assert flow.policy_figures([], None) == {"tokens_per_second": None, "queue_depth": None}


def scales_up() -> float:
    count = REGISTRY.get_sample_value("polyrl_operator_scale_seconds_count", {"direction": "up"})
    return count or 0.0


@dataclass
class Pod:
    role: str = "rollout"
    active: bool = True
    ready: bool = True
    draining: bool = False


def test_a_scale_is_timed_from_the_change_until_the_pool_settles() -> None:
    clock = ScaleClock()
    g = ("group", "ns", "g")
    assert clock.observe(g, desired=2, settled=True, now=0.0) is None  # first sight, settled
    assert clock.observe(g, desired=6, settled=False, now=10.0) is None
    assert clock.observe(g, desired=6, settled=False, now=15.0) is None
    assert clock.observe(g, desired=6, settled=True, now=22.5) == ("up", 12.5)
    assert clock.observe(g, desired=6, settled=True, now=30.0) is None  # nothing to time
    # A change before the last settled restarts the clock, in the new direction.
    assert clock.observe(g, desired=8, settled=False, now=40.0) is None
    assert clock.observe(g, desired=1, settled=False, now=41.0) is None
    assert clock.observe(g, desired=1, settled=True, now=50.0) == ("down", 9.0)


def test_a_pool_has_settled_only_with_every_active_pod_ready_and_none_draining() -> None:
    g = ("group", "ns", "observed")
    metrics.observe_scale(g, desired=2, pods=[Pod(), Pod()])
    before = scales_up()
    metrics.observe_scale(g, desired=3, pods=[Pod(), Pod(), Pod(ready=False)])
    metrics.observe_scale(
        g, desired=3, pods=[Pod(), Pod(), Pod(), Pod(active=False, draining=True)]
    )
    assert metrics.SCALING.started.get(g) is not None  # a pod still drains: not settled
    metrics.observe_scale(g, desired=3, pods=[Pod(), Pod(), Pod(), Pod(role="trainer")])
    assert g not in metrics.SCALING.started
    assert scales_up() == before + 1
    metrics.forget_pods(g)
    assert g not in metrics.SCALING.targets


def test_a_new_group_that_is_not_ready_yet_is_timed_as_a_scale_up() -> None:
    clock = ScaleClock()
    g = ("group", "ns", "new")
    assert clock.observe(g, desired=3, settled=False, now=0.0) is None
    assert clock.observe(g, desired=3, settled=True, now=4.0) == ("up", 4.0)
    clock.forget(g)
    assert clock.observe(g, desired=3, settled=True, now=9.0) is None


def test_dropped_episodes_are_summed_over_the_runners_by_policy_and_reason() -> None:
    beats = [
        beat(
            "j-workflow-0", "workflow", dropped_episodes={"agent": {"tool": 2}, "-": {"prompt": 1}}
        ),
        beat("j-workflow-1", "workflow", dropped_episodes={"agent": {"tool": 1, "turns": 4}}),
        beat("j-trainer-0", "trainer"),  # not a runner: counts nothing
        beat("j-workflow-2", "workflow"),  # a runner that dropped nothing yet
    ]
    by_policy = flow.dropped_episodes(beats)
    assert by_policy == {"agent": {"tool": 3, "turns": 4}, "-": {"prompt": 1}}
    assert flow.totals(by_policy) == {"prompt": 1, "tool": 3, "turns": 4}
    assert flow.totals({"agent": {}}) is None  # nothing dropped: no figure
