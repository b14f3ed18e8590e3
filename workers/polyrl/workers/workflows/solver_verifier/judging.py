"""How well a judging policy (a verifier) judges the answers it is actually shown, by version.

The trainer's evaluation of a verifier is held out and fixed: right answers and synthetic near
misses of the task (`workflows.solver_verifier.verdicts`). It cannot see what the verifier is trained on, the other
policy's answers, whose mistakes are of their own kinds. The workflow runner can: it knows for
every judged answer whether it was right, and what each sampled verdict said. This tallies
those per window of the judge's weight versions, as balanced accuracy (the mean of "yes" on
right answers and "no" on wrong ones, so a judge that always says one thing scores 0.5 and the
mix of right and wrong answers does not move the figure); a completion with no verdict counts
as wrong for either kind. Measured on the quick start (docs/benchmarks.md): 0.79 over the
verifier's first 25 versions, 0.88 over versions 125-149, while the held-out figure stayed at
0.77.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

WINDOW = 10  # weight versions per figure


@dataclasses.dataclass(slots=True)
class Tally:
    yes_on_right: int = 0
    right: int = 0
    no_on_wrong: int = 0
    wrong: int = 0
    no_verdict: int = 0

    def add(self, truth: bool, said: bool | None) -> None:
        if said is None:
            self.no_verdict += 1
        if truth:
            self.right += 1
            self.yes_on_right += said is True
        else:
            self.wrong += 1
            self.no_on_wrong += said is False

    def balanced_accuracy(self) -> float | None:
        """None until both right and wrong answers have been judged."""
        if not (self.right and self.wrong):
            return None
        return (self.yes_on_right / self.right + self.no_on_wrong / self.wrong) / 2


class JudgedAccuracy:
    """Tallies per (policy, window of `window` versions); closed windows become metric records."""

    def __init__(self, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1 version, got {window}")
        self.window = window
        self.tallies: dict[tuple[str, int], Tally] = {}
        self.newest: dict[str, int] = {}
        self.closed_below: dict[str, int] = {}  # windows under this were reported
        self.too_late = 0  # verdicts for a window already reported, not counted

    def add(self, policy: str, version: int, truth: bool, said: bool | None) -> None:
        index = version // self.window
        if index < self.closed_below.get(policy, 0):
            self.too_late += 1
            return
        self.tallies.setdefault((policy, index), Tally()).add(truth, said)
        self.newest[policy] = max(self.newest.get(policy, index), index)

    def closed(self) -> list[dict[str, Any]]:
        """Records of the windows two newer ones have started after, removed from the tally.

        One window of slack: answers sampled with weights a few versions old (up to the job's
        `maxStaleness`) still arrive after the next window has begun.
        """
        for policy, newest in self.newest.items():
            self.closed_below[policy] = max(self.closed_below.get(policy, 0), newest - 1)
        done = [key for key in self.tallies if key[1] < self.closed_below[key[0]]]
        return [self._record(key) for key in sorted(done)]

    def flush(self) -> list[dict[str, Any]]:
        """Records of every window, the open ones included (at shutdown)."""
        return [self._record(key) for key in sorted(self.tallies)]

    def _record(self, key: tuple[str, int]) -> dict[str, Any]:
        policy, index = key
        tally = self.tallies.pop(key)
        judged = tally.right + tally.wrong
        return {
            "policy": policy,
            "source": "workflow",
            "versions": [index * self.window, (index + 1) * self.window - 1],
            "judged": judged,
            "judged_balanced_accuracy": tally.balanced_accuracy(),
            "judged_yes_on_right": tally.yes_on_right / tally.right if tally.right else None,
            "judged_no_on_wrong": tally.no_on_wrong / tally.wrong if tally.wrong else None,
            "judged_no_verdict": tally.no_verdict / judged,
            "time": time.time(),
        }
