"""A job whose model is a GGUF file, under `polyrl run`: the trainer converts it once into
the model cache, rollout workers serve it through the bundle, it trains and is evaluated by
its own rollout pool (`evalOn: rollout`, under the per-role NATS users `polyrl run` signs);
a file whose hash differs from the declared one stops the run before any process starts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.gguf_files import write_llama

from polyrl.workers.models import loading

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

JOB = """
apiVersion: polyrl.dev/v1alpha1
kind: RLJob
metadata: {name: gguf}
spec:
  image: ghcr.io/polyrl/worker:0.1.0
  policies:
    - name: solver
      model: {path: "FILE", sha256: "HASH", dtype: bfloat16, promptFormat: chat}
      trainer: {steps: 2, batchSize: 16, microBatchSize: 16, evalEvery: 2, evalOn: rollout, evalSamples: 4, optimizer: {lr: 1.0e-4}}
      rollout: {replicas: 1, engine: torch}
  workflow:
    name: single
    task: {name: arithmetic, params: {digits: 1, template: "What is {left} + {right}?", match: first-number}, heldOut: 16}
    episodesInFlight: 8
  algorithm: {mode: async, groupSize: 4, maxNewTokens: 4, maxStaleness: 2}
"""


def _run(tmp_path: Path, file: Path, digest: str) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("FILE", str(file)).replace("HASH", digest))
    env = {**os.environ, "POLYRL_MODEL_CACHE": str(tmp_path / "models")}
    return subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "run", str(job), "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=480, check=False, env=env,
    )  # fmt: skip


def test_a_gguf_model_is_converted_once_served_through_the_bundle_trained_and_pool_evaluated(
    tmp_path: Path, tiny_bpe: Callable[[str], Path]
) -> None:
    model, tokenizer = loading.load_directory(tiny_bpe("llama"), dtype=torch.float32)
    file = write_llama(model, tokenizer, tmp_path / "tiny.gguf")  # type: ignore[arg-type]
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    wrong = _run(tmp_path, file, "f" * 64)
    assert wrong.returncode != 0
    assert f"SHA-256 mismatch: the file's is {digest}" in wrong.stderr
    assert not (tmp_path / "run" / "logs").exists() or not any(
        (tmp_path / "run" / "logs").iterdir()
    )
    proc = _run(tmp_path, file, digest)
    assert proc.returncode == 0, proc.stderr[-4000:]
    converted = tmp_path / "models" / "gguf" / digest[:16]
    assert json.loads((converted / "polyrl-gguf.json").read_text())["sha256"] == digest
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r.get("policy") == "solver" and "step" in r]
    assert max(r["step"] for r in records) == 2
    evaluated = {r["step"]: r for r in records if "accuracy" in r}
    assert sorted(evaluated) == [0, 2]  # the start, once the pool serves it, and the end
    for figures in evaluated.values():
        assert 0.0 <= figures["pass_at_1"] <= figures["pass_at_4"] <= 1.0
        assert figures["eval_off_version"] == 0  # answered at the version evaluated
    assert evaluated[2]["version"] > evaluated[0]["version"]
    rollout = next((tmp_path / "run" / "logs").glob("*-rollout-0.log")).read_text()
    assert "refused" not in rollout
