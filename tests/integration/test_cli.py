"""The `polyrl` command, run as a process, answers --help and --version (what it explains
without starting anything: tests/unit/test_cli.py)."""

from __future__ import annotations

import subprocess
import sys

from polyrl._version import __version__


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polyrl.cli", *args], capture_output=True, text=True, check=False
    )


def test_version_prints_the_package_version() -> None:
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"polyrl {__version__}"


def test_help_lists_the_run_command() -> None:
    proc = run("--help")
    assert proc.returncode == 0
    assert "run" in proc.stdout
    assert "RLJob" in proc.stdout
