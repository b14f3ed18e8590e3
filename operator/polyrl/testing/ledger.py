"""Reconciling a trajectory stream's ids with what the trainer's ledger says it trained.

The published set comes from the stream itself (every message id the workflow runners got
stored), never from the workers' logs; the trained set from the trainer's `ledger.jsonl`
(`polyrl.workers.ledger`). A resume rolls back every step of the old epoch after the
checkpoint it resumed from: the new epoch's first step is that checkpoint's step plus one.

Every published id must end in exactly one of: trained once; trained in a rolled-back step
and again later ("retrained after a resume", allowed, bounded by checkpointEvery x batch
per resume); trained only in a rolled-back step; dropped as stale; or still in the stream
when training stopped (unconsumed). Anything else is a fault: trained twice without a
rollback between, or trained but never published.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Entry:
    epoch: int
    step: int
    trained: tuple[str, ...]
    stale: tuple[str, ...]


def read(path: Path) -> list[Entry]:
    """The ledger's lines; a last line cut short by a kill is ignored."""
    entries = []
    for line in path.read_text().splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        entries.append(Entry(doc["epoch"], doc["step"], tuple(doc["trained"]), tuple(doc["stale"])))
    return entries


def rolled_back(entries: Sequence[Entry]) -> set[tuple[int, int]]:
    """(epoch, step) of every step a later epoch's resume undid."""
    first_step: dict[int, int] = {}
    for e in entries:
        first_step.setdefault(e.epoch, e.step)
    undone = set()
    for e in entries:
        resumed = [first_step[later] - 1 for later in first_step if later > e.epoch]
        if resumed and e.step > min(resumed):
            undone.add((e.epoch, e.step))
    return undone


@dataclass
class Account:
    published: int = 0
    trained_once: int = 0
    retrained_after_resume: int = 0
    only_rolled_back: int = 0
    stale: int = 0
    unconsumed: int = 0
    trained_twice: list[str] = field(default_factory=list)
    never_published: list[str] = field(default_factory=list)
    resumes: int = 0

    @property
    def faults(self) -> int:
        return len(self.trained_twice) + len(self.never_published)

    @property
    def accounted(self) -> int:
        return (
            self.trained_once + self.retrained_after_resume + self.only_rolled_back
            + self.stale + self.unconsumed
        )  # fmt: skip

    def row(self) -> dict[str, Any]:
        return {
            "published": self.published, "trained once": self.trained_once,
            "retrained after a resume": self.retrained_after_resume,
            "rolled back only": self.only_rolled_back, "stale": self.stale,
            "unconsumed at stop": self.unconsumed, "resumes": self.resumes,
            "trained twice": len(self.trained_twice),
            "trained, never published": len(self.never_published),
        }  # fmt: skip


def account(published: Iterable[str], entries: Sequence[Entry]) -> Account:
    ids = list(published)
    undone = rolled_back(entries)
    kept: collections.Counter[str] = collections.Counter()
    undone_ids: collections.Counter[str] = collections.Counter()
    stale: set[str] = set()
    for e in entries:
        target = undone_ids if (e.epoch, e.step) in undone else kept
        target.update(e.trained)
        stale.update(e.stale)
    result = Account(published=len(ids), resumes=len({e.epoch for e in entries}) - 1)
    for i in set(ids):
        if kept[i] > 1:
            result.trained_twice.append(i)
        elif kept[i] == 1:
            if undone_ids[i]:
                result.retrained_after_resume += 1
            else:
                result.trained_once += 1
        elif undone_ids[i]:
            result.only_rolled_back += 1
        elif i in stale:
            result.stale += 1
        else:
            result.unconsumed += 1
    result.never_published = sorted((set(kept) | set(undone_ids)) - set(ids))
    return result


def table(rows: dict[str, Account], extra: dict[str, dict[str, str]] | None = None) -> str:
    """One line per case, one column per outcome, then the `extra` columns (by case)."""
    columns = list(next(iter(rows.values())).row()) if rows else []
    extra = extra or {}
    width = max((len(k) for k in rows), default=4)
    lines = [" | ".join(["case".ljust(width), *columns, *extra])]
    for case, acc in rows.items():
        values = acc.row()
        cells = [str(values[c]).rjust(len(c)) for c in columns]
        cells += [by_case.get(case, "") for by_case in extra.values()]
        lines.append(" | ".join([case.ljust(width), *cells]))
    return "\n".join(lines)
