"""A reward that fails on every sample stops the job, saying why, instead of training nothing.

One failed reward drops that sample only (`Episode.drop`, counted): a user's reward function
may trip over one odd completion. But a reward that fails on every sample (a missing
column, a typo in a `module:function`, an exception on every input) would leave the trainers
waiting forever for samples that never come, with nothing on the job to say so. So the
workflow runner counts failures in a row: after `FAILING_IN_A_ROW` with none scored in
between, it stops with `RewardsFailing`, which is invalid input (`runtime.ConfigError`): the
operator marks the job Failed with the message as its condition, `polyrl run` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyrl.workers.errors import ConfigError

FAILING_IN_A_ROW = 64


class RewardsFailing(ConfigError):
    """The reward failed on every one of the last `FAILING_IN_A_ROW` samples."""


@dataclass
class RewardHealth:
    """Failures in a row since the last scored sample; `check` raises once there are too many."""

    limit: int = FAILING_IN_A_ROW
    in_a_row: int = 0
    scored: int = 0
    last: str = ""

    def record(self, *, scored: int, dropped: list[str]) -> None:
        """One episode's samples: how many got a reward, and why the others did not."""
        self.scored += scored
        self.in_a_row = len(dropped) if scored else self.in_a_row + len(dropped)
        if dropped:
            self.last = dropped[-1]

    def check(self) -> None:
        if self.in_a_row >= self.limit:
            before = f"{self.scored} scored before them" if self.scored else "none scored yet"
            raise RewardsFailing(
                f"the reward failed on the last {self.in_a_row} samples in a row ({before}); "
                f"the last failure: {self.last}"
            )
