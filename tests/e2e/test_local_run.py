"""`polyrl run` end to end on a tiny job: real processes, real NATS, real training steps."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests import natslog

from polyrl.testing.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

JOB = """\
apiVersion: polyrl.dev/v1alpha1
kind: RLJob
metadata: {name: tiny}
spec:
  policies:
  - name: solver
    model: {path: "tiny-llama://e2e-run"}
    trainer: {batchSize: 16, microBatchSize: 16, checkpointEvery: 2, warmupSteps: 60, evalEvery: 2}
    rollout: {replicas: 1, maxBatchSize: 16}
  workflow: {name: single, episodesInFlight: 2, task: {name: arithmetic, params: {digits: 1}}}
  algorithm: {groupSize: 4, maxNewTokens: 3}
  stop: {steps: STEPS}
"""


def processes_of(run_dir: Path) -> list[int]:
    """PIDs whose environment points into `run_dir` (the run's workers), by inspection."""
    marker = f"POLYRL_METRICS_FILE={run_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def start(tmp_path: Path, steps: int) -> tuple[subprocess.Popen[str], Path]:
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("STEPS", str(steps)))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "polyrl.cli", "run", str(job), "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return proc, run_dir


def records(run_dir: Path) -> list[dict[str, object]]:
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text() if metrics.exists() else ""
    return [json.loads(x) for x in text.splitlines()]


def test_a_run_trains_publishes_checkpoints_and_ctrl_c_stops_every_process_cleanly(
    tmp_path: Path,
) -> None:
    """One run checks both: what a run leaves (metrics, versions, a checkpoint, the plot) and
    that Ctrl-C, mid-training, stops every process and still leaves them."""
    proc, run_dir = start(tmp_path, steps=10000)

    def at_step_2() -> bool:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        return any(r.get("step") == 2 for r in records(run_dir))

    try:
        wait_until("the run at step 2", at_step_2, timeout=300, interval=0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert "stopping" in out
    assert processes_of(run_dir) == []  # every worker and the nats-server are gone
    first, *lines = records(run_dir)
    assert first["step"] == 0  # the held-out accuracy RL starts from, after the warm-up
    assert 0 <= first["accuracy"] <= 1  # type: ignore[operator]
    assert first["warmup_steps"] == 60
    steps = [x["step"] for x in lines]
    assert steps[:2] == [1, 2], steps
    assert steps == list(range(1, len(steps) + 1))  # no step lost or repeated
    assert [x["version"] for x in lines] == steps
    assert "accuracy" in lines[1]  # evalEvery: 2
    assert (run_dir / "trainers" / "local" / "tiny" / "solver" / "checkpoint").is_dir()
    assert (run_dir / "plot.png").stat().st_size > 1000
    assert f"run directory: {run_dir}" in " ".join(out.split())
    # every worker ran as its role's NATS user (polyrl.api.access), and needed nothing more
    assert natslog.violations(run_dir) == []
