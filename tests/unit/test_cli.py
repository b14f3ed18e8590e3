"""The `polyrl` command answers --help and --version and explains what it cannot do yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polyrl import cli
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


def test_no_command_prints_help_and_exits_with_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([]) == cli.EXIT_USAGE
    assert "usage: polyrl" in capsys.readouterr().out


def test_run_with_a_missing_job_file_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", str(tmp_path / "nope.yaml")]) == cli.EXIT_USAGE
    assert "no such job file" in capsys.readouterr().err


JOB = """\
apiVersion: polyrl.dev/v1alpha1
kind: RLJob
metadata: {name: tiny}
spec:
  policies:
  - name: solver
    model: {path: "tiny-llama://checked"}
  workflow: {name: single, task: {name: arithmetic}}
"""


@pytest.mark.parametrize(
    ("edit", "cause"),
    [
        (("name: single", "name: 'nosuchmodule:fn'"), "No module named 'nosuchmodule'"),
        (("name: arithmetic", "name: nosuchtask"), "unknown task 'nosuchtask'"),
        (("tiny-llama://checked", "/does/not/exist"), "'/does/not/exist' does not exist"),
    ],
    ids=["workflow", "task", "model"],
)
def test_run_refuses_input_the_workers_would_refuse_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], cause: str
) -> None:
    job = tmp_path / "job.yaml"
    assert edit[0] in JOB
    job.write_text(JOB.replace(*edit))
    run_dir = tmp_path / "run"
    assert cli.main(["run", str(job), "--run-dir", str(run_dir)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "polyrl run: invalid input: " in err
    assert cause in err
    assert not run_dir.exists()  # nothing was started
