"""A task whose reward varies between any few random completions, for tests that need updates.

Arithmetic's exact reward is 0 for every sample of an untrained tiny model, so its advantages
are all 0 and nothing trains: a test of what training changed would pass vacuously. Here the
reward is the share of digits in the completion, which differs between completions of random
tokens almost surely.
"""

from __future__ import annotations

import random

from polyrl.workers.tasks import arithmetic, base


class DigitShare:
    """Arithmetic's problems, rewarded by the share of the completion's characters that are
    digits."""

    def __init__(self, task: arithmetic.Arithmetic) -> None:
        self.task, self.name = task, "digit-share"

    def sample(self, rng: random.Random) -> base.Problem:
        return self.task.sample(rng)

    def held_out(self) -> list[base.Problem]:
        return list(self.task.held_out())

    def reward(self, problem: base.Problem, completion: str) -> float:
        return sum(c.isdigit() for c in completion) / max(1, len(completion))


def make(params: base.Params, *, held_out: int, seed: int) -> DigitShare:
    return DigitShare(arithmetic.make(params, held_out=held_out, seed=seed))
