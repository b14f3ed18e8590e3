"""Two policies with different tokenizers in one job (examples/two-tokenizers.yaml) under
`polyrl run`, as its header says to run it: a Qwen2-style solver and a Llama-style verifier,
each with its own BPE vocabulary and chat template, train together; text crosses between
them and ids never do (the workflow runner encodes each request with the asked policy's
tokenizer, and a rollout worker refuses ids its model cannot take: none were refused)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests import documented, natslog

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = "examples/two-tokenizers.yaml"


def test_two_policies_with_different_tokenizers_and_chat_templates_train_together(
    tmp_path: Path,
) -> None:
    proc, records = documented.run_example(EXAMPLE, tmp_path)
    run_dir = tmp_path / "run"
    for policy in ("solver", "verifier"):
        steps = [r["step"] for r in records if r.get("policy") == policy and "step" in r]
        assert max(steps) == 20, (policy, steps)
        assert f"{policy:<9} held-out" in proc.stderr  # its summary line: evaluated on its split
    runner = next((run_dir / "logs").glob("*-workflow-0.log")).read_text()
    sizes = dict(re.findall(r"(\w+)'s tokenizer loaded \((\d+) tokens\)", runner))
    assert sizes.keys() == {"solver", "verifier"}
    assert sizes["solver"] != sizes["verifier"]  # two vocabularies
    assert re.search(r"\d+ episodes done, 0 failed, 0 dropped", runner), runner[-2000:]
    for log in (run_dir / "logs").glob("*-rollout-0.log"):
        assert "refused" not in log.read_text(), log.name
    assert natslog.violations(run_dir) == []  # every role's grant covered what it did
