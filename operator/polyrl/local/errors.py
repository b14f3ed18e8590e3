"""One error type for every start-up failure, so callers and humans see the same message.

The message always names the step that failed and, where there is one, the log file to
read next: "a port in use" or "etcd did not start" is only useful with both.
"""

from __future__ import annotations

from pathlib import Path


class StartupError(RuntimeError):
    """A local service (nats-server, a control-plane binary) could not be built or started."""

    def __init__(self, step: str, reason: str, log: Path | None = None) -> None:
        self.step = step
        self.reason = reason
        self.log = log
        where = f"; see log: {log}" if log else ""
        super().__init__(f"step '{step}' failed: {reason}{where}")
