"""scripts/smollm2_start.py measures a job's starting point on its own held-out split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB = """
apiVersion: polyrl.dev/v1alpha1
kind: RLJob
metadata: {name: start}
spec:
  policies:
    - name: solver
      model: {path: "tiny-bpe://llama/start", promptFormat: chat}
      rollout: {maxBatchSize: 16}
  workflow:
    task: {name: arithmetic, params: {max: 9, system: "Sum.", match: last-number}, heldOut: 6}
  algorithm: {maxNewTokens: 4, temperature: 1.0}
"""


@pytest.mark.slow
def test_the_start_script_scores_greedy_and_sampled_answers_on_the_held_out_split(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "smollm2_start.py"), str(job), "--samples", "3"],
        capture_output=True, text=True, timeout=300, check=False,
        env={"POLYRL_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout)
    assert figures["problems"] == 6
    assert 0.0 <= figures["pass_at_1"] <= figures["pass_at_3"] <= 1.0
    assert 0.0 <= figures["greedy"] <= 1.0
    assert len(figures["greedy_examples"]) == 5
    assert all(prompt.endswith("=") for prompt, _ in figures["greedy_examples"])
