"""The autoscaling recipe in docs/operator.md names the stream and consumer a job really has."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from polyrl.api import naming
from polyrl.api.naming import JobNames

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"


def test_the_keda_recipe_scales_the_policy_group_on_its_rollout_consumers_queue() -> None:
    section = DOC.read_text().split("## Autoscaling rollouts", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    scaled = yaml.safe_load(block.group(1))
    names = JobNames(namespace=scaled["metadata"]["namespace"], job="math")
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (
        "PolicyGroup",
        naming.policy_group("math", "solver"),
    )
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "nats-jetstream"
    assert trigger["metadata"]["stream"] == names.requests_stream("solver")
    assert trigger["metadata"]["consumer"] == JobNames.rollout_consumer
