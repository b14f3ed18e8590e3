"""The generated CRDs make the API server reject bad manifests with readable messages."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from polyrl.api.resources import RLJob
from polyrl.local import jobfile
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


SERVED_BY = "rollout.servedBy must name another policy of the job"
FROZEN = "a frozen policy is never trained"


def lora_job(
    lora: tuple[str, ...] = ("solver", "verifier", "judge"), **served_by: str
) -> dict[str, Any]:
    """Three policies on one base, those in `lora` training adapters, each policy named
    as a keyword served by the policy it names (`rollout.servedBy`)."""
    doc = copy.deepcopy(GOOD)
    doc["spec"]["policies"] = [
        {
            "name": name,
            "model": {"path": "tiny-llama://base"},
            "trainer": {"lora": {"rank": 4}} if name in lora else {},
            "rollout": {"servedBy": served_by[name]} if name in served_by else {},
        }
        for name in ("solver", "verifier", "judge")
    ]
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


def test_a_shared_pool_of_two_lora_policies_is_accepted(
    kubectl: Kubectl, crds_applied: None, namespace: str
) -> None:
    doc = lora_job(verifier="solver", judge="solver")
    proc = apply(kubectl, namespace, doc)
    assert proc.returncode == 0, proc.stderr
    RLJob.model_validate({**doc, "metadata": {"name": "valid", "namespace": "x"}})


def test_a_job_with_a_frozen_judge_is_accepted(
    kubectl: Kubectl, crds_applied: None, namespace: str
) -> None:
    doc = job(spec__policies__1__frozen=True)
    proc = apply(kubectl, namespace, doc)
    assert proc.returncode == 0, proc.stderr
    stored = kubectl.json("get", "rlj", "valid", "-n", namespace)
    assert stored["spec"]["policies"][1]["frozen"] is True
    assert stored["spec"]["policies"][0]["frozen"] is False  # defaulted
    assert RLJob.model_validate({**doc, "metadata": {"name": "valid"}}).spec.trained()[0].name == (
        "solver"
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
        (
            job(spec__policies__0__trainer={"evalSamples": 8}),
            "evalSamples needs evalOn: rollout",
        ),
        (
            job(spec__policies__0__trainer={"lora": {"rank": 0}}),
            "spec.policies[0].trainer.lora.rank",
        ),
        (
            job(spec__policies__0__trainer={"strategy": "fsdp2", "lora": {"rank": 8}}),
            "trainer.strategy fsdp2 does not support trainer.lora",
        ),
        (
            job(spec__policies__0__trainer={"strategy": "fsdp2", "evalEvery": 5}),
            "trainer.strategy fsdp2 needs trainer.evalOn: rollout when trainer.evalEvery > 0",
        ),
        (
            job(spec__policies__0__trainer={"checkpoint": {"asyncWrites": True}}),
            "trainer.checkpoint.asyncWrites needs trainer.strategy fsdp2",
        ),
        (job(spec__policies__0__trainer={"strategy": "zero3"}), 'Unsupported value: "zero3"'),
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
        (lora_job(verifier="critic"), SERVED_BY),
        (lora_job(verifier="verifier"), SERVED_BY),
        (lora_job(verifier="solver", judge="verifier"), SERVED_BY),
        (lora_job(solver="verifier", verifier="solver"), SERVED_BY),
        (lora_job(lora=("verifier", "judge"), verifier="solver"), SERVED_BY),
        (lora_job(lora=("solver", "judge"), verifier="solver"), SERVED_BY),
        (
            job(spec__policies__1__frozen=True, spec__policies__1__trainer={"lora": {"rank": 4}}),
            FROZEN,
        ),
        (
            job(spec__policies__1__frozen=True, spec__policies__1__trainer={"warmupSteps": 5}),
            FROZEN,
        ),
        (job(spec__policies__1__frozen=True, spec__policies__1__trainer={"evalEvery": 5}), FROZEN),
        (job(spec__policies__1__frozen=True, spec__policies__1__trainer={"steps": 5}), FROZEN),
        (
            job(spec__policies__0__frozen=True, spec__policies__1__frozen=True),
            "every policy is frozen: a job trains at least one policy",
        ),
        (
            job(spec__policies__1__frozen=True, spec__algorithm={"mode": "sync"}),
            "frozen policies need algorithm.mode async",
        ),
        (
            job(spec__algorithm={"loss": {"name": "grpo", "m2Threshold": 0.1}}),
            "algorithm.loss.m2Threshold applies to name m2po only",
        ),
        (
            job(spec__algorithm={"loss": {"name": "m2po", "clipHigh": 0.3}}),
            "algorithm.loss.clipLow and clipHigh do not apply to m2po",
        ),
        (
            job(spec__algorithm={"loss": {"name": "gspo", "overlongPenalty": 1.0}}),
            "overlongPenalty and overlongFilter apply to name dapo only",
        ),
        (job(spec__algorithm={"loss": {"name": "ppo"}}), 'Unsupported value: "ppo"'),
        (job(spec__policies__0__trainer={"miniBatches": 0}), "miniBatches"),
    ],
    ids=[
        "replicas-outside-bounds",
        "engine-outside-enum",
        "duplicate-policy",
        "missing-model",
        "zero-batch-size",
        "eval-samples-on-the-trainer",
        "lora-rank-zero",
        "fsdp2-with-lora",
        "fsdp2-evaluating-on-the-trainer",
        "async-checkpoint-writes-under-ddp",
        "unknown-strategy",
        "negative-staleness",
        "not-dns",
        "child-name-too-long",
        "policy-not-dns-1035",
        "own-steps-in-sync-mode",
        "verifier-without-candidate",
        "verifier-answer-without-verdict",
        "verifier-role-outside-enum",
        "served-by-a-missing-policy",
        "served-by-itself",
        "served-by-a-served-policy-chain",
        "served-by-each-other",
        "served-by-a-policy-without-lora",
        "served-without-lora-itself",
        "frozen-with-lora",
        "frozen-with-a-warm-up",
        "frozen-with-an-evaluation",
        "frozen-with-steps",
        "every-policy-frozen",
        "frozen-in-sync-mode",
        "loss-parameter-of-another-objective",
        "m2po-with-a-clip",
        "overlong-settings-outside-dapo",
        "loss-outside-enum",
        "zero-mini-batches",
    ],
)
def test_bad_manifests_are_rejected_with_a_readable_message(
    kubectl: Kubectl, crds_applied: None, namespace: str, doc: dict[str, Any], message: str
) -> None:
    proc = apply(kubectl, namespace, doc)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def task_job(params: dict[str, Any], name: str = "dataset") -> dict[str, Any]:
    return job(spec__workflow={"task": {"name": name, "params": params}})


def refused_by_the_models(doc: dict[str, Any]) -> str:
    """What `polyrl run` and the operator say of `doc` (they parse it with the models)."""
    with pytest.raises(ValidationError) as caught:
        RLJob.model_validate({**doc, "metadata": {**doc["metadata"], "namespace": "x"}})
    return str(caught.value)


TRAIN = "pvc://math-data/train.parquet"


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"path": TRAIN, "format": "parket"}, "params.format: Invalid value", "must be one of"),
        ({"format": "verl"}, "params.path: Required value", "needs params.path (the data file)"),
        ({"path": TRAIN, "heldOutFraction": 3}, "params.heldOutFraction: Invalid value", "below 1"),
        (
            {"path": TRAIN, "heldOutPath": "pvc://math-data/test.parquet", "heldOutFraction": 0.1},
            "params: Invalid value",
            "params.heldOutPath and params.heldOutFraction exclude each other",
        ),
        ({"path": TRAIN, "promptkey": "q"}, "params: Invalid value", "reads only the params"),
        ({"path": TRAIN, "rewardStyle": "foo"}, "params.rewardStyle: Invalid value", "verl, trl"),
        ({"path": TRAIN, "rewardTimeout": -1}, "params.rewardTimeout: Invalid value", "above 0"),
        ({"path": ""}, "params.path: Invalid value", "params.path must be non-empty text"),
        ({"path": TRAIN, "answerKey": 7}, "params.answerKey: Invalid value", "non-empty text"),
        ({"path": True}, "params.path: Invalid value", "must be of type integer,string"),
        ({"path": TRAIN, "heldOutFraction": "5%"}, "params.heldOutFraction: Invalid", "number"),
    ],
    ids=[
        "format-misspelt",
        "no-path",
        "fraction-3",
        "two-held-out-sources",
        "unknown-key",
        "unknown-reward-style",
        "negative-timeout",
        "empty-path",
        "integer-answer-key",
        "bool-path",
        "text-fraction",
    ],
)
def test_bad_dataset_params_are_rejected_naming_the_param(
    kubectl: Kubectl,
    crds_applied: None,
    namespace: str,
    params: dict[str, Any],
    field: str,
    message: str,
) -> None:
    doc = task_job(params)
    proc = apply(kubectl, namespace, doc)
    assert proc.returncode != 0
    assert f"spec.workflow.task.{field}" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr
    # The models refuse it too, naming the same param (the CEL rules' message, or its type).
    param = field.split(":")[0].removeprefix("params.")
    said = refused_by_the_models(doc)
    assert "spec.workflow.task" in said
    assert (f"params.{param}" if param != "params" else message) in said, said


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("dataset", {"path": "data/math/train.parquet", "heldOutPath": "data/math/test.parquet"}),
        (
            "dataset",
            {
                "path": TRAIN,
                "format": "trl",
                "promptKey": "question",
                "answerKey": "reward_model.ground_truth",
                "heldOutFraction": 0,
                "reward": "my_rewards:score",
                "rewardStyle": "verl",
                "rewardTimeout": 0.5,
            },
        ),
        ("dataset", {"path": TRAIN, "heldOutFraction": 0.05, "rewardTimeout": 30}),
        ("arithmetic", {"digits": 2, "ops": "+-", "reverse": True}),
        ("my_tasks:make", {"format": 3, "heldOutFraction": 7, "ratio": 0.5, "on": False}),
    ],
    ids=["example", "every-param", "fraction-and-timeout", "arithmetic", "user-task"],
)
def test_good_task_params_are_accepted_by_the_api_server_and_the_models(
    kubectl: Kubectl, crds_applied: None, namespace: str, name: str, params: dict[str, Any]
) -> None:
    doc = task_job(params, name)
    proc = apply(kubectl, namespace, doc, "--dry-run=server")
    assert proc.returncode == 0, proc.stderr
    assert RLJob.model_validate({**doc, "metadata": {"name": "valid", "namespace": "x"}})


def test_a_dataset_key_keeps_its_type_in_every_task(
    kubectl: Kubectl, crds_applied: None, namespace: str
) -> None:
    doc = task_job({"reward": 0.5}, "my_tasks:make")
    proc = apply(kubectl, namespace, doc)
    assert proc.returncode != 0
    assert "spec.workflow.task.params.reward: Invalid value" in proc.stderr, proc.stderr
    assert "params.reward must be text or an integer (got 0.5)" in refused_by_the_models(doc)


def test_every_shipped_example_is_accepted_by_the_api_server_and_polyrl_run(
    kubectl: Kubectl, crds_applied: None, namespace: str, repo_root_module: Path
) -> None:
    examples = sorted((repo_root_module / "examples").glob("*.yaml"))
    assert any(p.name == "math-dataset.yaml" for p in examples)
    for path in examples:
        proc = kubectl("apply", "-n", namespace, "--dry-run=server", "-f", str(path), check=False)
        assert proc.returncode == 0, (path.name, proc.stderr)
        jobfile.load(path)


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
