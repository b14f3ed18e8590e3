"""Which trajectories each training step learned from: `ledger.jsonl` beside the checkpoint.

With `trainer.ledger` on, the trainer appends one line per step, before it acknowledges the
step's messages: its epoch and step, the ids it trained on and the ids it dropped as too
old. Written before the acks, so a trainer killed between the two leaves the ids in the
ledger and unacknowledged in the stream: redelivered, they are trained again by the next
epoch, in a step after the one the old epoch's copy was rolled back with. The file lives in
the trainer's directory, on its checkpoint claim, so every epoch appends to the same one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

FILE = "ledger.jsonl"


class Ledger:
    def __init__(self, directory: Path | None) -> None:
        """`directory` None: a ledger that records nothing (`trainer.ledger` off)."""
        self.path = directory / FILE if directory is not None else None

    def record(
        self, *, epoch: int, step: int, trained: Sequence[str], stale: Sequence[str]
    ) -> None:
        if self.path is None:
            return
        line = json.dumps(
            {"epoch": epoch, "step": step, "trained": list(trained), "stale": list(stale)}
        )
        with self.path.open("a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())  # on the claim before the acks go out
