"""The CRDs in crds/ are generated from the models and are structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polyrl import cli
from polyrl.api import crds

REPO = Path(__file__).resolve().parents[3]


def test_the_committed_crds_are_current() -> None:
    assert cli.main(["crds", "--check", "-o", str(REPO / "crds")]) == 0, (
        "crds/ is stale: run `polyrl crds`"
    )


def test_a_stale_crd_file_is_detected(tmp_path: Path) -> None:
    assert cli.main(["crds", "-o", str(tmp_path)]) == 0
    target = tmp_path / "polyrl.dev_rljobs.yaml"
    target.write_text(target.read_text().replace("maxStaleness", "maxStale"))
    assert cli.main(["crds", "--check", "-o", str(tmp_path)]) == 1


def _walk(node: Any, path: str = "") -> list[str]:
    """Paths of schema nodes without a type (not allowed in a structural schema)."""
    if not isinstance(node, dict):
        return []
    bad = []
    exempt = node.get("x-kubernetes-preserve-unknown-fields") or node.get(
        "x-kubernetes-int-or-string"
    )
    if "type" not in node and not exempt:
        bad.append(path or "/")
    for key, child in node.get("properties", {}).items():
        bad += _walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        bad += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        bad += _walk(node["additionalProperties"], f"{path}{{}}")
    return bad


def test_every_schema_node_has_a_type() -> None:
    for crd in (crds.rljob_crd(), crds.policygroup_crd()):
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert _walk(schema) == []


def test_the_policygroup_scale_subresource_points_at_rollout_replicas() -> None:
    scale = crds.policygroup_crd()["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.rollout.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
