"""How well a verifier judges the answers it is shown: balanced accuracy per window of versions."""

from __future__ import annotations

import pytest

from polyrl.workers.workflows.solver_verifier.judging import JudgedAccuracy, Tally


def test_balanced_accuracy_weighs_right_and_wrong_answers_equally() -> None:
    tally = Tally()
    right: list[bool | None] = [True, True, True, False]  # 3 of 4 called right
    wrong: list[bool | None] = [False, True, None, None, None, None, None, None]  # 1 of 8 wrong
    for said in right:
        tally.add(truth=True, said=said)
    for said in wrong:
        tally.add(truth=False, said=said)
    assert tally.balanced_accuracy() == pytest.approx((3 / 4 + 1 / 8) / 2)
    assert tally.no_verdict == 6


def test_always_saying_yes_scores_one_half_however_many_answers_are_right() -> None:
    for right, wrong in ((90, 10), (10, 90)):
        tally = Tally()
        for _ in range(right):
            tally.add(truth=True, said=True)
        for _ in range(wrong):
            tally.add(truth=False, said=True)
        assert tally.balanced_accuracy() == 0.5


def test_no_figure_until_both_kinds_of_answer_were_judged() -> None:
    tally = Tally()
    tally.add(truth=True, said=True)
    assert tally.balanced_accuracy() is None


def test_a_window_is_reported_once_two_newer_ones_have_begun_and_late_verdicts_are_dropped() -> (
    None
):
    judging = JudgedAccuracy(window=10)
    judging.add("verifier", 3, truth=True, said=True)
    judging.add("verifier", 9, truth=False, said=False)
    judging.add("verifier", 14, truth=False, said=True)  # window 1 begins: 0 may still grow
    assert judging.closed() == []
    judging.add("verifier", 8, truth=True, said=False)  # stale weights, still counted
    judging.add("verifier", 21, truth=True, said=True)  # window 2 begins: 0 is done
    [record] = judging.closed()
    assert record["versions"] == [0, 9]
    assert record["judged"] == 3
    assert record["judged_balanced_accuracy"] == pytest.approx((1 / 2 + 1) / 2)
    assert record["judged_yes_on_right"] == 0.5
    assert record["judged_no_on_wrong"] == 1.0
    assert (record["policy"], record["source"]) == ("verifier", "workflow")
    judging.add("verifier", 7, truth=True, said=True)  # too late for a reported window
    assert judging.too_late == 1
    assert judging.closed() == []
    rest = judging.flush()
    assert [r["versions"] for r in rest] == [[10, 19], [20, 29]]
    assert rest[0]["judged_balanced_accuracy"] is None  # only a wrong answer in versions 10-19
    assert judging.flush() == []


def test_policies_are_tallied_apart() -> None:
    judging = JudgedAccuracy(window=5)
    judging.add("a", 0, truth=True, said=True)
    judging.add("b", 0, truth=True, said=False)
    judging.add("a", 12, truth=True, said=True)
    assert [(r["policy"], r["versions"]) for r in judging.closed()] == [("a", [0, 4])]
    assert [(r["policy"], r["versions"]) for r in judging.flush()] == [
        ("a", [10, 14]),
        ("b", [0, 4]),
    ]


def test_a_window_must_hold_a_version() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        JudgedAccuracy(window=0)
