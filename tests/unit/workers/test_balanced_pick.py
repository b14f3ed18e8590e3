"""Which solver answers the verifier judges: a right and a wrong one whenever there are both."""

from __future__ import annotations

import random

import pytest

from polyrl.workers.workflows.solver_verifier import balanced_pick


@pytest.mark.parametrize("seed", range(20))
def test_a_group_with_right_and_wrong_answers_gives_one_of_each(seed: int) -> None:
    rng = random.Random(seed)
    correct = [rng.random() < 0.3 for _ in range(8)]
    correct[rng.randrange(8)] = True
    correct[(correct.index(True) + 1) % 8] = False
    picked = balanced_pick(correct, random.Random(seed))
    assert len(picked) == 2
    assert sorted(correct[i] for i in picked) == [False, True]


@pytest.mark.parametrize("value", [True, False])
def test_a_uniform_group_gives_two_distinct_answers(value: bool) -> None:
    picked = balanced_pick([value] * 8, random.Random(0))
    assert len(set(picked)) == 2
    assert all(0 <= i < 8 for i in picked)


def test_a_group_of_one_gives_that_answer() -> None:
    assert balanced_pick([True], random.Random(0)) == [0]
