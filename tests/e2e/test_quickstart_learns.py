"""What the quick start claims, checked on the shipped job: RL learns, and only from rewards.

Two full `polyrl run examples/quickstart.yaml` runs of up to 10 minutes each, so this is not
part of `make test`: run it with `make test-learning`. The rewarded run is the README's own
quick-start commands, run as written (then `polyrl export`). The claims:

* within 10 minutes the solver's greedy accuracy on the 1,000 held-out problems rises at least
  40 points above its value at the start of RL (the step-0 evaluation, after the warm start);
* the same run with `algorithm.shuffleRewards: true` (rewards permuted within each batch, so
  no completion is rewarded for being right) gains nothing;
* the verifier's balanced accuracy rises on its exam (`workflows.solver_verifier.exam`): the
  warm-started solver's greedy answers to 500 held-out problems, right and wrong weighed
  equally, the same answers at every evaluation, so that a rise is the judge's own; while its
  held-out figure (right answers and the task's synthetic near misses) does not fall. The
  synthetic near misses are not the solver's kind of mistake, so RL, which trains the
  verifier on the solver's answers, is not expected to raise that figure. The figure the
  runner logs on the answers judged during RL (`judging`) is not asserted: those answers get
  better as the solver learns, which raises it whether or not the judge improves
  (docs/benchmarks.md).

The warm starts are seeded and repeat exactly on one machine, but not across machines: they
follow the CPU's float arithmetic. Where the verifier's warm start already judges the exam at
about 0.88, RL does not add +0.03 in 150 steps; where it starts at 0.62 (a 2-core AVX-512
machine) the claim holds (docs/benchmarks.md, "Learning: the quick start's claims"). So the
verifier's exam claim is asserted only where the warm start leaves room (`EXAM_ROOM`); elsewhere
the test asserts the rest and is skipped with the measured figures as its reason.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests import documented

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.learning]

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
LIMIT_SECONDS = 600


def readme_commands(workdir: Path) -> list[str]:
    """The README's quick-start commands (activate, run, export), to run as written in
    `workdir`, a scratch copy of the repository's layout (its examples/ and .venv/)."""
    commands = [c for c in documented.block("README.md", "Quick start") if c != "make test"]
    commands.remove("make quickstart")  # it runs `polyrl run examples/quickstart.yaml`
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("examples", ".venv"):
        (workdir / name).symlink_to(documented.REPO / name)
    return commands


def run_quickstart(
    tmp_path: Path, *, shuffle: bool, timeout: float
) -> tuple[dict[str, list[dict[str, Any]]], float]:
    """The run's metrics by policy (the runner's judging lines under "<policy>/judged") and
    its wall time in seconds. The rewarded run is the README's own commands; the control
    runs a copy of the job with `shuffleRewards`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if shuffle:
        doc = yaml.safe_load(QUICKSTART.read_text())
        doc["spec"]["algorithm"]["shuffleRewards"] = True
        job = tmp_path / "job.yaml"
        job.write_text(yaml.safe_dump(doc))
        run_dir = tmp_path / "run"
        argv = [sys.executable, "-m", "polyrl.cli", "run", str(job), "--run-dir", str(run_dir)]
    else:
        commands = readme_commands(tmp_path)
        run_dir = tmp_path / "runs" / "qs"
        assert f"--run-dir {run_dir.relative_to(tmp_path)}" in " ".join(commands)
        argv = ["bash", "-c", "set -e; " + "; ".join(commands)]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the run stops its workers (a kill would not)
        proc.communicate(timeout=120)
        raise
    seconds = time.monotonic() - started
    assert proc.returncode == 0, stderr[-3000:]
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        key = record["policy"] + ("/judged" if record.get("source") == "workflow" else "")
        by_policy.setdefault(key, []).append(record)
    return by_policy, seconds


def gain(records: list[dict[str, Any]], key: str) -> tuple[float, float]:
    evals = [r[key] for r in sorted(records, key=lambda r: r["step"]) if key in r]
    assert len(evals) >= 2, f"fewer than two {key} evaluations"
    return evals[0], evals[-1]


# The control's solver collapses, so nearly all its groups are alike and the runner, refilling
# its batches, generates about six times as much per step: it took 651 s where the rewarded run
# took 493 s. Its time is not a claim; it gets more room.
CONTROL_SECONDS = 2 * LIMIT_SECONDS


# Where the verifier's warm start already judges the exam above this, RL in the run's steps
# leaves it where it is (0.883 -> 0.882 on an EPYC machine, against 0.624 -> 0.68-0.72 on a
# Xeon; docs/benchmarks.md): its +0.03 is asserted only below it.
EXAM_ROOM = 0.80


# Two runs, over the suite's 600 s per test.
@pytest.mark.timeout(LIMIT_SECONDS + 60 + CONTROL_SECONDS + 240)
def test_the_quickstart_solver_learns_from_rewards_and_the_verifier_improves(
    tmp_path: Path,
) -> None:
    # Every claim is measured before any is asserted, so that a failure reports them all.
    trained, seconds = run_quickstart(
        tmp_path / "rewarded", shuffle=False, timeout=LIMIT_SECONDS + 60
    )
    assert trained["solver"][0]["step"] == 0  # the start is measured after the warm-up
    # The README's `polyrl export runs/qs solver-hf --policy solver` left a model directory.
    assert (tmp_path / "rewarded" / "solver-hf" / "config.json").is_file()
    start, end = gain(trained["solver"], "accuracy")
    exam_start, exam_end = gain(trained["verifier"], "answers_balanced_accuracy")
    held_start, held_end = gain(trained["verifier"], "balanced_accuracy")
    control, control_seconds = run_quickstart(
        tmp_path / "shuffled", shuffle=True, timeout=CONTROL_SECONDS
    )
    shuffled_start, shuffled_end = gain(control["solver"], "accuracy")
    # What holds on every machine.
    claims = {
        f"solver +0.40 in 10 minutes: {start:.3f} -> {end:.3f} in {seconds:.0f} s": (
            end - start >= 0.40 and seconds <= LIMIT_SECONDS
        ),
        f"verifier held out no worse than -0.03: {held_start:.3f} -> {held_end:.3f}": (
            held_end >= held_start - 0.03
        ),
        f"shuffled control at most +0.05: {shuffled_start:.3f} -> {shuffled_end:.3f} "
        f"in {control_seconds:.0f} s": shuffled_end - shuffled_start <= 0.05,
    }
    # Always answering "y" scores 0.5: ask for judgement above chance. The exam's figure
    # is good to about 0.015 (500 answers, greedy verdicts).
    exam = f"verifier's exam +0.03: {exam_start:.3f} -> {exam_end:.3f}"
    room = exam_start <= EXAM_ROOM
    if room:
        claims[exam] = exam_end >= max(exam_start, 0.5) + 0.03
    said = "\n".join(f"{'met' if met else 'NOT MET'}: {claim}" for claim, met in claims.items())
    assert all(claims.values()), said
    if not room:
        pytest.skip(
            f"{said}\nnot asserted here: {exam} (the verifier's warm start judges the exam at "
            f"{exam_start:.3f}, above {EXAM_ROOM}, which leaves RL no room to add +0.03)"
        )
