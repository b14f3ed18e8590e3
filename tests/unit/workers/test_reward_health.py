"""A reward failing on every sample stops the runner with the reason; a few failures do not."""

from __future__ import annotations

import pytest

from polyrl.workers.errors import ConfigError
from polyrl.workers.runner.reward_health import RewardHealth, RewardsFailing


def test_failures_in_a_row_up_to_the_limit_raise_naming_the_last_failure() -> None:
    health = RewardHealth(limit=8)
    for i in range(3):
        health.record(scored=0, dropped=[f"reward f on problem {i}: raised KeyError('x')"] * 2)
        health.check()  # 6 in a row: not yet
    health.record(scored=0, dropped=["reward f on problem 9: raised KeyError('answer')"] * 2)
    with pytest.raises(RewardsFailing) as caught:
        health.check()
    assert isinstance(caught.value, ConfigError)  # invalid input: the job fails, not retries
    message = str(caught.value)
    assert "failed on the last 8 samples in a row (none scored yet)" in message
    assert message.endswith("the last failure: reward f on problem 9: raised KeyError('answer')")


def test_one_scored_sample_resets_the_count() -> None:
    health = RewardHealth(limit=4)
    health.record(scored=0, dropped=["a", "b", "c"])
    health.record(scored=1, dropped=["d"])  # an episode with a reward: the reward works
    health.record(scored=0, dropped=["e", "f"])
    health.check()
    assert health.in_a_row == 3
    health.record(scored=0, dropped=["g"])
    with pytest.raises(RewardsFailing, match=r"last 4 samples in a row \(1 scored before them\)"):
        health.check()


def test_episodes_without_failures_never_stop_the_runner() -> None:
    health = RewardHealth(limit=1)
    for _ in range(100):
        health.record(scored=4, dropped=[])
        health.check()
    assert (health.in_a_row, health.scored) == (0, 400)
