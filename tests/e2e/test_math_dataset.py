"""The dataset example's whole path, shortened for CI: examples/math_dataset.py writes the
verl parquet and TRL jsonl files as its header says, then examples/math-dataset.yaml runs
under `polyrl run` with fewer steps: dataset rows (chat messages) -> the policy's chat
template -> generation -> math-verify reward -> GRPO steps -> weights synced to the rollout
worker -> held-out accuracy under the same reward. Learning is not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests import documented, natslog

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = documented.REPO / "examples" / "math-dataset.yaml"
SCRIPT = documented.REPO / "examples" / "math_dataset.py"


def short_job(tmp_path: Path) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    trainer = doc["spec"]["policies"][0]["trainer"]
    trainer |= {
        "steps": 4,
        "warmupSteps": 20,
        "evalEvery": 2,
        "batchSize": 16,
        "microBatchSize": 16,
    }
    doc["spec"]["workflow"]["task"]["heldOut"] = 20
    path = tmp_path / "math-dataset.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_math_dataset_example_runs_from_files_to_synced_weights(tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", "data/math", "--train", "400", "--test", "40"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "data/math/train.parquet").is_file()
    assert (tmp_path / "data/math/test.jsonl").is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "run", str(short_job(tmp_path)), "--run-dir", "run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("policy") == "solver" and "step" in r]
    assert max(r["step"] for r in steps) == 4
    assert [r["step"] for r in steps if "held_out" in r] == [0, 2, 4]
    assert all(0.0 <= r["held_out"] <= 1.0 for r in steps if "held_out" in r)
    rollout = (tmp_path / "run/logs/math-dataset-solver-rollout-0.log").read_text()
    assert "serving weight version 4" in rollout  # the last step's weights reached it
    runner = (tmp_path / "run/logs/math-dataset-workflow-0.log").read_text()
    assert "format detected" not in runner  # the example names its format
    assert "0 failed" in runner
    assert natslog.violations(tmp_path / "run") == []  # every role's grant covered what it did
