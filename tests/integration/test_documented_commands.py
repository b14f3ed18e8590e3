"""The documented commands that only make can say what they run (the unit side of this check,
that every documented command runs somewhere, is tests/unit/test_documented_commands.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests import documented


def test_make_quickstart_runs_the_documented_polyrl_run() -> None:
    recipe = subprocess.run(
        ["make", "-n", "quickstart"],
        cwd=documented.REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"{Path('.venv/bin/polyrl')} run examples/quickstart.yaml" in recipe
