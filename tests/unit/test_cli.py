"""The `polyrl` command explains what it cannot do yet (`python -m polyrl.cli --help` and
`--version`, run as a process: tests/integration/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyrl import cli


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


def test_bench_refuses_simulated_for_a_benchmark_that_has_no_simulated_form(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bench", "dataplane", "--simulated", "--quick"]) == cli.EXIT_USAGE
    assert "takes no --simulated" in capsys.readouterr().err
