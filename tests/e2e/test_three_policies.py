"""The three-policy example (examples/three-policies.yaml and its workflow module) under
`polyrl run`, as its header says to run it: every policy warms up on its own examples, is
evaluated on its own held-out split before and after, and shows in the plot and summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests import documented, natslog

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = "examples/three-policies.yaml"
POLICIES = ("solver", "reverser", "checker")


def test_the_three_policy_example_warms_up_and_evaluates_every_policy(tmp_path: Path) -> None:
    proc, records = documented.run_example(EXAMPLE, tmp_path)
    run_dir = tmp_path / "run"
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
    assert natslog.violations(run_dir) == []  # every role's grant covered what it did
