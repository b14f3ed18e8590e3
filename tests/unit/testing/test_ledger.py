"""The ledger's accounting: every published id ends in one outcome, and faults are named."""

from __future__ import annotations

from pathlib import Path

from polyrl.testing.ledger import Entry, account, read, rolled_back, table
from polyrl.workers.trainer.ledger import Ledger


def test_steps_after_the_checkpoint_a_later_epoch_resumed_from_are_rolled_back() -> None:
    entries = [
        Entry(0, 1, ("a",), ()), Entry(0, 2, ("b",), ()), Entry(0, 3, ("c",), ()),
        Entry(1, 3, ("c",), ()), Entry(1, 4, ("d",), ()),
    ]  # fmt: skip
    # epoch 1 starts at step 3: it resumed from the checkpoint at step 2
    assert rolled_back(entries) == {(0, 3)}
    acc = account(["a", "b", "c", "d", "e", "s"], [*entries, Entry(1, 5, (), ("s",))])
    assert (acc.trained_once, acc.retrained_after_resume, acc.stale, acc.unconsumed) == (3, 1, 1, 1)
    assert acc.resumes == 1
    assert acc.faults == 0
    assert acc.accounted == acc.published


def test_a_sample_trained_twice_without_a_rollback_or_never_published_is_a_fault() -> None:
    acc = account(["a", "b"], [Entry(0, 1, ("a", "b"), ()), Entry(0, 2, ("a", "x"), ())])
    assert acc.trained_twice == ["a"]
    assert acc.never_published == ["x"]
    assert acc.faults == 2


def test_a_sample_trained_only_in_a_rolled_back_step_is_counted_as_such() -> None:
    acc = account(
        ["a", "b"], [Entry(0, 1, ("a",), ()), Entry(0, 2, ("b",), ()), Entry(1, 2, (), ())]
    )
    assert acc.only_rolled_back == 1
    assert acc.trained_once == 1
    assert "rolled back only" in table({"case": acc})
    with_extra = table({"case": acc}, {"recovery": {"case": "2.5 s"}}).splitlines()
    assert with_extra[0].endswith("| recovery")
    assert with_extra[1].endswith("| 2.5 s")


def test_the_trainers_ledger_file_reads_back_and_a_cut_last_line_is_ignored(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.record(epoch=0, step=1, trained=["a", "b"], stale=["c"])
    ledger.record(epoch=0, step=2, trained=["d"], stale=[])
    with (tmp_path / "ledger.jsonl").open("a") as out:
        out.write('{"epoch": 0, "st')  # killed mid-write
    assert read(tmp_path / "ledger.jsonl") == [
        Entry(0, 1, ("a", "b"), ("c",)),
        Entry(0, 2, ("d",), ()),
    ]
    Ledger(None).record(epoch=0, step=3, trained=["e"], stale=[])  # off: writes nothing
