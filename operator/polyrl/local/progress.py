"""Live progress of a local run: one line per policy, redrawn on a terminal, printed
periodically otherwise (a log file or CI gets whole lines, not cursor movements)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import TracebackType
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from polyrl.local import report

PLAIN_EVERY = 30.0  # seconds between progress blocks when the output is not a terminal


class Progress:
    def __init__(
        self,
        metrics: Path,
        *,
        job: str,
        policies: list[str],
        budgets: dict[str, int] | None,
        stream: TextIO = sys.stderr,
    ) -> None:
        self.metrics, self.job, self.policies, self.budgets = metrics, job, policies, budgets
        self.console = Console(file=stream)
        self.stream = stream
        self.started = time.monotonic()
        self.printed = 0.0
        self.live: Live | None = None

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=2)
            self.live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(kind, err, tb)

    def _lines(self) -> list[str]:
        state = report.read(self.metrics)
        return report.lines(state, self.policies, self.budgets)

    def _render(self) -> Group:
        elapsed = time.monotonic() - self.started
        head = Text(f"{self.job}  {elapsed:.0f} s", style="bold")
        return Group(head, *(Text(line, no_wrap=False) for line in self._lines()))

    def tick(self) -> None:
        if self.live is not None:
            self.live.update(self._render())
            return
        now = time.monotonic()
        if now - self.printed >= PLAIN_EVERY:
            self.printed = now
            stamp = f"[{now - self.started:.0f} s]"
            for line in self._lines():
                print(f"{stamp} {line}", file=self.stream, flush=True)
