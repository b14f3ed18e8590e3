"""`polyrl run` refuses a bad job file with a readable error naming the field, and starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyrl import cli
from polyrl.local import jobfile

GOOD = """\
apiVersion: polyrl.dev/v1alpha1
kind: RLJob
metadata: {name: ok}
spec:
  policies: [{name: solver, model: {path: "tiny-llama://x"}}]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_a_good_job_file_loads_into_the_local_namespace(tmp_path: Path) -> None:
    job = jobfile.load(write(tmp_path, GOOD))
    assert (job.metadata.name, job.metadata.namespace) == ("ok", "local")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [unclosed", "not valid YAML"),
        ("apiVersion: v1\nkind: Pod\n", "expected a manifest of kind RLJob"),
        (
            GOOD.replace("{name: solver,", "{name: solver, rollout: {engine: tensorrt},"),
            "spec.policies.0.rollout.engine",
        ),
        (
            GOOD.replace('model: {path: "tiny-llama://x"}', "model: {}"),
            "spec.policies.0.model.path",
        ),
        (GOOD.replace("metadata: {name: ok}", "metadata: {name: Not_DNS}"), "metadata.name"),
        (
            GOOD
            + "  workflow: {task: {name: dataset, params: {path: t.parquet, format: parket}}}\n",
            "spec.workflow.task: Value error, params.format must be one of verl, trl, openrlhf",
        ),
    ],
    ids=["bad-yaml", "wrong-kind", "bad-engine", "missing-model", "bad-name", "bad-dataset-param"],
)
def test_a_malformed_job_file_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(jobfile.JobFileError, match=message.replace(".", r"\.")):
        jobfile.load(write(tmp_path, text))


def test_polyrl_run_exits_2_on_a_bad_job_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path, GOOD.replace("{name: solver,", "{name: solver, rollout: {replicas: -1},")
    )
    run_dir = tmp_path / "run"
    assert cli.main(["run", str(path), "--run-dir", str(run_dir)]) == cli.EXIT_USAGE
    assert "spec.policies.0.rollout.replicas" in capsys.readouterr().err
    assert not run_dir.exists()


def test_polyrl_run_refuses_bad_dataset_params_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = "{path: t.parquet, heldOutFraction: 3, promptkey: q}"
    path = write(tmp_path, GOOD + f"  workflow: {{task: {{name: dataset, params: {params}}}}}\n")
    run_dir = tmp_path / "run"
    assert cli.main(["run", str(path), "--run-dir", str(run_dir)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "spec.workflow.task: " in err
    assert "(unknown: promptkey)" in err
    assert "params.heldOutFraction must be at least 0 and below 1 (got 3)" in err
    assert not run_dir.exists()
