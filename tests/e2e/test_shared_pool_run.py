"""Two LoRA policies on one shared rollout pool under `polyrl run`: the verifier's
`rollout.servedBy: solver` gives the job one rollout process, serving both; both trainers
train and publish adapters; every role's NATS grant covered what it did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests import natslog

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

JOB = """\
apiVersion: polyrl.dev/v1alpha1
kind: RLJob
metadata: {name: shared}
spec:
  policies:
  - name: solver
    model: {path: "tiny-llama://shared-pool"}
    trainer: {batchSize: 16, microBatchSize: 16, lora: {rank: 4}, optimizer: {lr: 1.0e-3}}
    rollout: {replicas: 1, maxBatchSize: 32}
  - name: verifier
    model: {path: "tiny-llama://shared-pool"}
    trainer: {batchSize: 16, microBatchSize: 16, lora: {rank: 4}, optimizer: {lr: 1.0e-3}}
    rollout: {servedBy: solver}
  workflow: {name: solver-verifier, episodesInFlight: 4, task: {name: arithmetic, params: {digits: 1}}}
  algorithm: {groupSize: 4, maxNewTokens: 3}
  stop: {steps: 3}
"""


def test_a_shared_pool_serves_both_lora_policies_of_a_local_run(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "run", str(job), "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for policy in ("solver", "verifier"):
        steps = [r["step"] for r in records if r.get("policy") == policy and "loss" in r]
        assert max(steps, default=0) >= 3, (policy, steps)
        kinds = {r["published_kind"] for r in records
                 if r.get("policy") == policy and "published_kind" in r}  # fmt: skip
        assert kinds, policy
        assert all(set(k.split("+")) <= {"adapter", "adapter-delta"} for k in kinds), kinds
    logs = run_dir / "logs"
    rollouts = sorted(log.name for log in logs.glob("*rollout*.log"))
    assert len(rollouts) == 1, rollouts
    pool = (logs / rollouts[0]).read_text()
    assert "serving verifier beside solver" in pool
    assert "serving verifier weight version" in pool  # it followed the verifier's adapters
    assert natslog.violations(run_dir) == []  # the pool's grant covered both policies
