"""The calculator example (examples/calculator.yaml, calculator.py, calculator_tool.py) under
`polyrl run`, as its header says to run it: a tiny model warmed up on tool-call transcripts
calls the sandboxed calculator in most of its episodes, its conversations reach the trainer
with the tool's output masked out of the loss, and it is evaluated by playing held-out
problems to their end."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests import documented, natslog

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = "examples/calculator.yaml"


def test_the_calculator_example_calls_its_tool_and_trains_with_the_tools_output_masked(
    tmp_path: Path,
) -> None:
    proc, records = documented.run_example(EXAMPLE, tmp_path)
    played = [r for r in records if r.get("source") == "workflow"]
    conversations = sum(r["conversations"] for r in played)
    share = sum(r["tool_call_share"] * r["conversations"] for r in played) / conversations
    print(f"{conversations} conversations, {share:.2f} of them called the tool")
    assert conversations >= 40
    assert share >= 0.5  # the warm-up's transcripts taught the call
    steps = [r for r in records if r.get("policy") == "agent" and "shown_fraction" in r]
    assert len(steps) == 6
    assert all(r["shown_fraction"] > 0 for r in steps)  # tools' answers: shown, not trained on
    trainer = [r for r in records if r.get("source", "trainer") == "trainer"]
    evaluated = [r for r in trainer if "tool_calls_mean" in r]
    assert [r["step"] for r in evaluated] == [0, 6]
    assert evaluated[0]["before_warmup_tool_calls_mean"] == 0  # an untrained model calls nothing
    assert evaluated[0]["tool_calls_mean"] >= 0.5  # greedy, on held-out problems
    assert "agent  held-out" in proc.stderr
    assert natslog.violations(tmp_path / "run") == []
