"""The critique example (examples/critique.yaml and critique.py) under `polyrl run`, as its
header says to run it: two trained policies in a multi-turn exchange, the verifier's reply
the solver's next turn. Both train every step; the solver's batches carry the critique
shown, not trained on, and the verifier's none; no episode is dropped or fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests import documented, natslog

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = "examples/critique.yaml"


def test_the_critique_example_trains_a_solver_on_two_turns_around_the_verifiers_reply(
    tmp_path: Path,
) -> None:
    proc, records = documented.run_example(EXAMPLE, tmp_path)
    steps = {
        policy: [r for r in records if r.get("policy") == policy and "shown_fraction" in r]
        for policy in ("solver", "verifier")
    }
    assert [len(s) for s in steps.values()] == [6, 6]
    assert all(r["shown_fraction"] > 0.3 for r in steps["solver"])  # the critique, masked
    assert all(r["shown_fraction"] == 0 for r in steps["verifier"])  # one reply: all trained
    for policy in ("solver", "verifier"):
        assert f"{policy:<9} held-out" in proc.stderr
    runner = (tmp_path / "run" / "logs" / "critique-workflow-0.log").read_text()
    stopped = re.search(r"stopped: (\d+) episodes done, 0 failed, 0 dropped", runner)
    assert stopped is not None, runner[-2000:]
    assert int(stopped.group(1)) >= 40
    assert natslog.violations(tmp_path / "run") == []
