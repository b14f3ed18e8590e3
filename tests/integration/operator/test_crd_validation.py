"""The generated CRDs make the API server reject bad manifests with readable messages."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from polyrl.testing.kube import Kubectl

GOOD: dict[str, Any] = {
    "apiVersion": "polyrl.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "valid"},
    "spec": {
        "policies": [
            {"name": "solver", "model": {"path": "tiny-llama://solver"}},
            {"name": "verifier", "model": {"path": "tiny-llama://verifier"}},
        ]
    },
}


@pytest.fixture(scope="module")
def crds_applied(kubectl: Kubectl, repo_root_module: Path) -> None:
    kubectl("apply", "--server-side", "-f", str(repo_root_module / "crds"))
    for crd in ("rljobs.polyrl.dev", "policygroups.polyrl.dev"):
        kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")


@pytest.fixture(scope="module")
def repo_root_module() -> Path:
    return Path(__file__).resolve().parents[3]


def apply(kubectl: Kubectl, namespace: str, doc: dict[str, Any], *extra: str) -> Any:
    return kubectl(
        "apply", "-n", namespace, "-f", "-", *extra, input=yaml.safe_dump(doc), check=False
    )


def job(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    for path, value in changes.items():
        node: Any = doc
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if key.isdigit() else node[key]
        node[keys[-1]] = value
    return doc


def test_a_valid_job_is_accepted_and_defaulted(
    kubectl: Kubectl, crds_applied: None, namespace: str
) -> None:
    proc = apply(kubectl, namespace, GOOD)
    assert proc.returncode == 0, proc.stderr
    stored = kubectl.json("get", "rlj", "valid", "-n", namespace)
    solver = stored["spec"]["policies"][0]
    assert solver["rollout"]["engine"] == "torch"
    assert solver["trainer"]["optimizer"]["lr"] == 1e-5
    assert stored["spec"]["algorithm"]["mode"] == "async"
    assert (
        "rljob.polyrl.dev/valid" in kubectl("get", "polyrl", "-n", namespace, "-o", "name").stdout
    )


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            job(spec__policies__0__rollout={"replicas": 5, "maxReplicas": 3}),
            "minReplicas <= replicas <= maxReplicas",
        ),
        (job(spec__policies__0__rollout={"engine": "tensorrt"}), 'Unsupported value: "tensorrt"'),
        (job(spec__policies__1__name="solver"), "Duplicate value"),
        (
            job(spec__policies__0__model={"dtype": "bfloat16"}),
            "spec.policies[0].model.path: Required value",
        ),
        (job(spec__policies__0__trainer={"batchSize": 0}), "should be greater than or equal to 1"),
        (job(spec__algorithm={"maxStaleness": -1}), "spec.algorithm.maxStaleness"),
        (job(metadata={"name": "Bad_Name"}), "a lowercase RFC 1123"),
        (job(metadata={"name": "x" * 46}), "job and policy names are too long"),
        (job(spec__policies__0__name="9lives"), "spec.policies[0].name"),
        (
            job(spec__algorithm={"mode": "sync"}, spec__policies__0__trainer={"steps": 10}),
            "trainer.steps needs algorithm.mode async",
        ),
        (
            job(
                spec__workflow={
                    "verifier": {"messages": [{"role": "user", "content": "{problem}"}]}
                }
            ),
            "put {candidate} in one of them",
        ),
        (
            job(
                spec__workflow={
                    "verifier": {
                        "messages": [{"role": "user", "content": "{candidate}?"}],
                        "answer": "{working}",
                    }
                }
            ),
            "workflow.verifier.answer must contain {verdict}",
        ),
        (
            job(
                spec__workflow={
                    "verifier": {"messages": [{"role": "judge", "content": "{candidate}?"}]}
                }
            ),
            'Unsupported value: "judge"',
        ),
    ],
    ids=[
        "replicas-outside-bounds",
        "engine-outside-enum",
        "duplicate-policy",
        "missing-model",
        "zero-batch-size",
        "negative-staleness",
        "not-dns",
        "child-name-too-long",
        "policy-not-dns-1035",
        "own-steps-in-sync-mode",
        "verifier-without-candidate",
        "verifier-answer-without-verdict",
        "verifier-role-outside-enum",
    ],
)
def test_bad_manifests_are_rejected_with_a_readable_message(
    kubectl: Kubectl, crds_applied: None, namespace: str, doc: dict[str, Any], message: str
) -> None:
    proc = apply(kubectl, namespace, doc)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_a_job_name_that_is_dns_1123_but_not_dns_1035_is_rejected(
    kubectl: Kubectl, crds_applied: None, namespace: str
) -> None:
    proc = apply(kubectl, namespace, job(metadata={"name": "1st-job"}))
    assert proc.returncode != 0
    assert "metadata.name must be a DNS-1035 label" in proc.stderr


def test_an_unknown_field_fails_strict_validation(
    kubectl: Kubectl, crds_applied: None, namespace: str
) -> None:
    proc = apply(
        kubectl, namespace, job(spec__policies__0__rollot={"replicas": 2}), "--validate=strict"
    )
    assert proc.returncode != 0
    assert 'unknown field "spec.policies[0].rollot"' in proc.stderr


def test_a_policygroup_name_too_long_for_its_pods_is_rejected(
    kubectl: Kubectl, crds_applied: None, namespace: str
) -> None:
    doc = {
        "apiVersion": "polyrl.dev/v1alpha1",
        "kind": "PolicyGroup",
        "metadata": {"name": "p" * 55},
        "spec": {"jobRef": "valid", "policy": "solver"},
    }
    proc = apply(kubectl, namespace, doc)
    assert proc.returncode != 0
    assert "metadata.name is too long" in proc.stderr
