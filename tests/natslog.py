"""What a `polyrl run`'s nats-server said about permissions (its workers are per-role users)."""

from __future__ import annotations

from pathlib import Path


def violations(run_dir: Path) -> list[str]:
    """Every permissions violation the run's nats-server logged (none, when each role's
    grant in `polyrl.api.access` covers what it does)."""
    assert "resolver: MEMORY" in (run_dir / "nats" / "nats.conf").read_text()  # JWT users only
    log = (run_dir / "nats" / "nats-server.log").read_text()
    return [line for line in log.splitlines() if "Violation" in line]
