"""The three-policy example (examples/three-policies.yaml and its workflow module) under
`polyrl run`, as its header says to run it: every policy warms up on its own examples, is
evaluated on its own held-out split before and after, and shows in the plot and summary."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests import documented

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = "examples/three-policies.yaml"
POLICIES = ("solver", "reverser", "checker")


def header_command() -> list[str]:
    """The example's documented `polyrl run` line, split as a shell would."""
    runs = [c.text for c in documented.commands() if c.source == EXAMPLE]
    assert len(runs) == 1, runs
    assert runs[0].startswith("polyrl run "), runs
    return shlex.split(runs[0])


def test_the_three_policy_example_warms_up_and_evaluates_every_policy(tmp_path: Path) -> None:
    argv = header_command()
    # Substitutions: this interpreter's polyrl; the run directory in tmp_path; the example by
    # absolute path, run from elsewhere, so its module is found beside the job file.
    argv[argv.index("--run-dir") + 1] = str(tmp_path / "run")
    argv[argv.index(EXAMPLE)] = str(documented.REPO / EXAMPLE)
    argv[0:1] = [sys.executable, "-m", "polyrl.cli"]
    proc = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=480, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "run"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for policy in POLICIES:
        mine = [r for r in records if r.get("policy") == policy and "step" in r]
        first = next(r for r in mine if r["step"] == 0)
        assert first["warmup_steps"] == 200, policy
        assert first["held_out"] > first["before_warmup_held_out"], (policy, first)
        assert [r["step"] for r in mine if "held_out" in r] == [0, 10, 20], policy
        assert f"{policy:<9} held-out {first['held_out']:.3f} at step 0 ->" in proc.stderr
    assert (run_dir / "plot.png").stat().st_size > 10_000
    stages = [json.loads(x) for x in (run_dir / "stages.jsonl").read_text().splitlines()]
    assert {s["policy"] for s in stages if s["stage"] == "warming up"} == set(POLICIES)
    assert f"run directory: {run_dir}" in proc.stderr
