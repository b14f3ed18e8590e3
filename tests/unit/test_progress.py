"""Progress and ETA as status shows them."""

from __future__ import annotations

import pytest

from polyrl.operator import progress


def test_progress_is_steps_of_the_budget_and_needs_one() -> None:
    assert progress.progress(90, 200) == "90/200 (45%)"
    assert progress.progress(250, 200) == "200/200 (100%)"
    assert progress.progress(5, None) is None


def test_the_eta_is_the_steps_left_at_the_recent_pace() -> None:
    assert progress.eta(90, 200, 3.0, completed=False) == "5m30s"
    assert progress.eta(200, 200, 3.0, completed=False) == "0s"
    assert progress.eta(10, 200, None, completed=True) == "0s"  # a trainer that finished early
    assert progress.eta(10, 200, None, completed=False) is None  # no pace yet
    assert progress.eta(10, None, 3.0, completed=False) is None  # no budget


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (44.6, "45s"),
        (750, "12m30s"),
        (3 * 3600 + 300, "3h05m"),
        (2 * 86400 + 4 * 3600, "2d04h"),
    ],
)
def test_durations_read_like_kubectl_ages(seconds: float, shown: str) -> None:
    assert progress.duration(seconds) == shown
