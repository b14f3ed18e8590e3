"""The judge example (examples/judge.yaml and judge.py) under `polyrl run`, as its header
says to run it: a trained solver rewarded by a frozen judge's verdicts. The judge's group
runs a publisher (which puts its model into the Object Store once) and a rollout replica,
no trainer; the solver trains every step; the runner reports the judge's agreement with
the exact reward, and counts its failed verdicts apart (the example's fallback score)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests import documented, natslog

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = "examples/judge.yaml"


def test_the_judge_example_scores_a_trained_solver_with_a_frozen_judges_verdicts(
    tmp_path: Path,
) -> None:
    proc, records = documented.run_example(EXAMPLE, tmp_path)
    logs = tmp_path / "run" / "logs"
    assert sorted(p.name for p in logs.glob("*.log")) == [
        "judge-judge-publisher.log",
        "judge-judge-rollout-0.log",
        "judge-solver-rollout-0.log",
        "judge-solver-trainer-0.log",
        "judge-workflow-0.log",
    ]  # no trainer for the judge
    published = (logs / "judge-judge-publisher.log").read_text()
    assert "judge: published the model bundle" in published
    assert "version 0" in published
    assert "judge  frozen: served, never trained" in proc.stderr
    steps = [r for r in records if r.get("policy") == "solver" and r.get("step", 0) > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert not [r for r in records if r.get("policy") == "judge" and "step" in r]
    judged = [r for r in records if r.get("source") == "workflow" and r["policy"] == "judge"]
    verdicts = sum(r["verdicts"] for r in judged)
    assert verdicts >= 3 * 32  # every sample the solver trained on was judged
    for r in judged:
        assert 0 <= r["agreement"] <= 1
        assert 0 <= r["exactly_right_share"] <= 1
    runner = (logs / "judge-workflow-0.log").read_text()
    fallbacks = re.search(r"got the fallback score: \{'judge': (\d+)\}", runner)
    stopped = re.search(r"stopped: (\d+) episodes done, 0 failed, 0 dropped", runner)
    assert stopped is not None, runner[-2000:]
    # The tiny judge rarely says yes or no: its failed verdicts scored 0, counted apart.
    assert fallbacks is not None, runner[-2000:]
    assert int(fallbacks.group(1)) > 0
    assert natslog.violations(tmp_path / "run") == []
