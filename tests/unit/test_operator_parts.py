"""Pure parts of the operator: rendering checkpoint claims and pods, what a failed pod said,
backoff, the CRDs' schema hashes, and what the models refuse."""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from polyrl.api import crds, naming, natstls, plan
from polyrl.api.base import memory_bytes, now_rfc3339
from polyrl.api.launch import Role
from polyrl.api.resources import RLJob
from polyrl.operator import metrics, natshub, podinfo, refused, render, scaling
from polyrl.testing import pki
from polyrl.testing.waiting import wait_until_async

JOB: dict[str, Any] = {
    "metadata": {"name": "math", "namespace": "team", "uid": "u-1"},
    "spec": {
        "policies": [
            {
                "name": "solver",
                "model": {"path": "tiny-llama://s"},
                "trainer": {"checkpoint": {"size": "2Gi", "storageClassName": "fast"}},
            }
        ]
    },
}


def test_a_checkpoint_claim_is_owned_by_the_job_only_when_it_goes_with_it() -> None:
    job = RLJob.model_validate(JOB)
    policy = job.spec.policies[0]
    owner = render.owner_ref("RLJob", "math", "u-1")
    kept = render.checkpoint_claim(job, policy, owner=None)
    assert kept["metadata"]["name"] == naming.checkpoint_claim("math", "solver")
    assert "ownerReferences" not in kept["metadata"]
    assert kept["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert kept["spec"]["storageClassName"] == "fast"
    assert policy.trainer.checkpoint.when_deleted == "Retain"  # the default keeps the model
    deleted = render.checkpoint_claim(job, policy, owner=owner)
    assert deleted["metadata"]["ownerReferences"] == [owner]


def test_the_first_trainer_pod_mounts_its_claim_and_every_pod_reports_its_end() -> None:
    job = RLJob.model_validate(JOB)
    launches = plan.plan(job, nats_url="nats://n:4222").launches
    trainer = next(x for x in launches if x.role == Role.TRAINER)
    pod = render.pod(trainer, namespace="team", owner={})
    spec = pod["spec"]
    assert {
        "name": "checkpoints",
        "persistentVolumeClaim": {"claimName": "math-solver-checkpoints"},
    } in spec["volumes"]
    container = spec["containers"][0]
    assert {"name": "checkpoints", "mountPath": "/var/lib/polyrl"} in container["volumeMounts"]
    for launch in launches:
        rendered = render.pod(launch, namespace="team", owner={})["spec"]["containers"][0]
        assert rendered["terminationMessagePolicy"] == "FallbackToLogsOnError"


@pytest.mark.parametrize(
    ("strategy", "mounted", "access"),
    [("ddp", [0], "ReadWriteOnce"), ("fsdp2", [0, 1], "ReadWriteMany")],
)
def test_every_pod_of_a_sharded_trainer_mounts_a_claim_they_share(
    strategy: str, mounted: list[int], access: str
) -> None:
    """ddp: rank 0 alone saves and resumes; fsdp2: each rank writes and reads its shards."""
    doc = copy.deepcopy(JOB)
    doc["spec"]["policies"][0]["trainer"] |= {"replicas": 2, "strategy": strategy}
    job = RLJob.model_validate(doc)
    trainers = [
        x for x in plan.plan(job, nats_url="nats://n:4222").launches if x.role == Role.TRAINER
    ]
    assert [t.replica for t in trainers if t.checkpoint_claim] == mounted
    claim = render.checkpoint_claim(job, job.spec.policies[0], owner=None)
    assert claim["spec"]["accessModes"] == [access]


def pod_body(exit_code: int, message: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "math-workflow-0",
            "namespace": "team",
            "labels": {naming.L_ROLE: "workflow"},
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": exit_code, "message": message}}}
            ],
        },
    }


def test_a_failed_pod_says_why_and_whether_its_input_was_refused() -> None:
    refused = podinfo.from_body(pod_body(2, "invalid input: unknown task 'nosuchtask'\n"))
    assert refused.invalid_input
    assert refused.failure() == "workflow pod math-workflow-0 exited 2: unknown task 'nosuchtask'"
    # torchrun exits 1 whatever its ranks said: the message carries the verdict.
    trainer = podinfo.from_body(
        pod_body(1, "loading\ninvalid input: model path '/x' does not exist\n")
    )
    assert trainer.invalid_input
    assert trainer.failure().endswith("exited 1: model path '/x' does not exist")
    crashed = podinfo.from_body(pod_body(1, "Traceback...\nRuntimeError: boom\n"))
    assert not crashed.invalid_input
    assert crashed.failure().endswith("exited 1: RuntimeError: boom")


def test_a_restarted_containers_last_state_is_read_too() -> None:
    body = pod_body(0, "")
    body["status"] = {
        "phase": "Running",
        "containerStatuses": [
            {"state": {"running": {}}, "lastState": {"terminated": {"exitCode": 3, "message": "x"}}}
        ],
    }
    info = podinfo.from_body(body)
    assert (info.exit_code, info.message) == (3, "x")


def test_backoff_is_over_only_after_its_delay() -> None:
    assert scaling.backoff_over(None, 3)
    assert scaling.backoff_over(now_rfc3339(), 0)
    assert not scaling.backoff_over(now_rfc3339(), 3)  # 4 s after the third failure
    assert scaling.backoff_over("2000-01-01T00:00:00Z", 30)


def test_each_crd_carries_the_hash_of_its_schema_and_a_change_changes_it() -> None:
    hashes = crds.schema_hashes()
    assert set(hashes) == {"rljobs.polyrl.dev", "policygroups.polyrl.dev"}
    crd = crds.rljob_crd()
    assert crd["metadata"]["annotations"][crds.SCHEMA_HASH] == hashes["rljobs.polyrl.dev"]
    changed = crds.rljob_crd()
    changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ].pop("suspend")
    assert crds.spec_hash(changed["spec"]) != hashes["rljobs.polyrl.dev"]


def test_the_pods_gauge_sums_every_loops_pods_and_drops_a_stopped_loops() -> None:
    from dataclasses import dataclass

    from prometheus_client import REGISTRY

    @dataclass
    class Pod:
        role: str
        phase: str

    def pods(role: str, phase: str) -> float | None:
        labels = {"role": role, "phase": phase}
        return REGISTRY.get_sample_value("polyrl_operator_pods", labels)

    metrics.observe_pods(("group", "ns", "a"), [Pod("rollout", "Running")] * 2)
    metrics.observe_pods(
        ("group", "ns", "b"), [Pod("rollout", "Running"), Pod("trainer", "Pending")]
    )
    assert pods("rollout", "Running") == 3
    assert pods("trainer", "Pending") == 1
    metrics.observe_pods(("group", "ns", "b"), [Pod("trainer", "Running")])
    assert pods("trainer", "Pending") == 0  # a label no loop sees any more reads 0
    metrics.forget_pods(("group", "ns", "a"))
    assert pods("rollout", "Running") == 0
    assert pods("trainer", "Running") == 1
    metrics.forget_pods(("group", "ns", "b"))


def test_a_pvc_model_is_mounted_read_only_in_trainer_pods_only() -> None:
    doc = copy.deepcopy(JOB)
    doc["spec"]["policies"][0]["model"] = {
        "path": "pvc://models/qwen/0.5b",
        "tokenizer": "pvc://tokenizers/qwen",
    }
    launches = plan.plan(RLJob.model_validate(doc), nats_url="nats://n:4222").launches
    for launch in launches:
        spec = render.pod(launch, namespace="team", owner={})["spec"]
        mounts = spec["containers"][0]["volumeMounts"]
        claims = {
            v["persistentVolumeClaim"]["claimName"]
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v
        }
        if launch.role != Role.TRAINER:
            assert not claims & {"models", "tokenizers"}  # rollouts read the Object Store
            continue
        assert {"models", "tokenizers"} <= claims
        assert {
            "name": "model-0",
            "mountPath": "/mnt/polyrl/pvc/models",
            "readOnly": True,
        } in mounts
        assert {
            "name": "model-1",
            "mountPath": "/mnt/polyrl/pvc/tokenizers",
            "readOnly": True,
        } in mounts


def test_a_pvc_path_without_a_claim_and_a_path_is_refused_by_the_api() -> None:
    doc = copy.deepcopy(JOB)
    for bad in ("pvc://claim", "pvc://claim/../etc", "pvc:///abs"):
        doc["spec"]["policies"][0]["model"] = {"path": bad}
        with pytest.raises(ValidationError, match="expected pvc://<claim>/<path inside"):
            RLJob.model_validate(doc)


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("8Gi", 8 * 2**30), ("500M", 500 * 10**6), (1024, 1024), ("1.5Gi", 3 * 2**29), ("1e9", 10**9)],
)
def test_memory_quantities_read_as_kubernetes_writes_them(quantity: Any, expected: int) -> None:
    assert memory_bytes(quantity) == expected


def test_a_word_is_not_a_memory_quantity() -> None:
    with pytest.raises(ValueError, match="is not a memory quantity"):
        memory_bytes("lots")


def test_every_pod_mounts_the_nats_secret_where_its_worker_reads_tls_from() -> None:
    job = RLJob.model_validate(JOB)
    for launch in plan.plan(job, nats_url="tls://n:4222").launches:
        spec = render.pod(launch, namespace="team", owner={}, nats_secret="nats-creds")["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == render.NATS_VOLUME)
        assert volume["secret"] == {
            "secretName": "nats-creds",
            "optional": True,
            "defaultMode": 0o440,
        }
        container = spec["containers"][0]
        mount = {"name": render.NATS_VOLUME, "mountPath": natstls.TLS_MOUNT, "readOnly": True}
        assert mount in container["volumeMounts"]
        assert {"name": natstls.TLS_DIR_ENV, "value": natstls.TLS_MOUNT} in container["env"]
        plain = render.pod(launch, namespace="team", owner={})["spec"]
        assert all(v["name"] != render.NATS_VOLUME for v in plain["volumes"])


def test_the_operator_reads_tls_from_the_secrets_ca_and_client_pair(tmp_path: Path) -> None:
    made = pki.generate(tmp_path)
    data = {
        natstls.CA: base64.b64encode(made.ca.cert.read_bytes()).decode(),
        natstls.CERT: base64.b64encode(made.admin.cert.read_bytes()).decode(),
        natstls.KEY: base64.b64encode(made.admin.key.read_bytes()).decode(),
    }
    tls = natshub._tls(data)["tls"]
    assert isinstance(tls, ssl.SSLContext)
    assert tls.verify_mode == ssl.CERT_REQUIRED
    assert tls.check_hostname
    assert natshub._tls({"token": "dG9r"}) == {}  # no CA: no TLS options


async def test_a_closed_tls_socket_without_a_client_certificate_gets_the_certificate_hint(
    tmp_path: Path,
) -> None:
    (tmp_path / natstls.CA).write_text("ca")
    assert natstls.lacks_client_cert(tmp_path)
    errors = natstls.LastError(logging.getLogger("t"), no_client_cert=True)
    await errors.record(BrokenPipeError())
    assert "wants a client certificate: tls.crt and tls.key" in errors.why(TimeoutError())
    refused = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] alert")
    refused.reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    await errors.record(refused)
    await errors.record(ConnectionResetError())  # the closed socket after it says less
    assert errors.why(TimeoutError()).startswith("TLS: TLSV13_ALERT_CERTIFICATE_REQUIRED")
    (tmp_path / natstls.CERT).write_text("c")
    (tmp_path / natstls.KEY).write_text("k")
    assert not natstls.lacks_client_cert(tmp_path)
    plain = natstls.LastError(logging.getLogger("t"))
    await plain.record(BrokenPipeError())
    assert plain.why(TimeoutError()) == "BrokenPipeError"  # no TLS hint without TLS


def test_pvc_data_files_are_mounted_in_workflow_and_trainer_pods_once_per_claim() -> None:
    doc = copy.deepcopy(JOB)
    doc["spec"]["policies"][0]["model"] = {"path": "pvc://shared/model"}
    doc["spec"]["workflow"] = {
        "name": "single",
        "task": {
            "name": "dataset",
            "params": {"path": "pvc://data/math/train.parquet", "heldOutPath": "pvc://shared/t"},
        },
    }
    for launch in plan.plan(RLJob.model_validate(doc), nats_url="nats://n:4222").launches:
        spec = render.pod(launch, namespace="team", owner={})["spec"]
        claims = sorted(
            v["persistentVolumeClaim"]["claimName"]
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v and v["name"] != "checkpoints"
        )
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        if launch.role == Role.ROLLOUT:
            assert claims == []
            continue
        expected = ["data", "shared"]  # trainers also read the model's claim: mounted once
        assert claims == expected
        assert {"/mnt/polyrl/pvc/data", "/mnt/polyrl/pvc/shared"} <= mounts


def test_configmap_and_secret_data_files_are_mounted_read_only_where_the_task_reads() -> None:
    doc = copy.deepcopy(JOB)
    doc["spec"]["workflow"] = {
        "name": "single",
        "task": {
            "name": "dataset",
            "params": {
                "path": "configmap://math-small/train.jsonl",
                "heldOutPath": "secret://held/t.jsonl",
            },
        },
    }
    for launch in plan.plan(RLJob.model_validate(doc), nats_url="nats://n:4222").launches:
        spec = render.pod(launch, namespace="team", owner={})["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        if launch.role == Role.ROLLOUT:
            assert not {"data-cm-0", "data-secret-0"} & set(volumes)
            continue
        assert volumes["data-cm-0"]["configMap"] == {"name": "math-small", "defaultMode": 0o440}
        assert volumes["data-secret-0"]["secret"] == {"secretName": "held", "defaultMode": 0o440}
        assert mounts["data-cm-0"] == {
            "name": "data-cm-0", "mountPath": "/mnt/polyrl/configmap/math-small", "readOnly": True,
        }  # fmt: skip
        assert mounts["data-secret-0"]["mountPath"] == "/mnt/polyrl/secret/held"
        assert mounts["data-secret-0"]["readOnly"] is True


def test_a_malformed_pvc_data_path_mounts_nothing_and_is_left_to_the_tasks_own_check() -> None:
    doc = copy.deepcopy(JOB)
    doc["spec"]["workflow"] = {"task": {"name": "dataset", "params": {"path": "pvc://only"}}}
    assert plan.data_claims(RLJob.model_validate(doc)) == []


def test_every_worker_pod_declares_its_metrics_port_and_tells_the_worker() -> None:
    for launch in plan.plan(RLJob.model_validate(JOB), nats_url="nats://n:4222").launches:
        container = render.pod(launch, namespace="team", owner={})["spec"]["containers"][0]
        assert {"name": "metrics", "containerPort": 9400} in container["ports"]
        assert {"name": "POLYRL_METRICS_PORT", "value": "9400"} in container["env"]


class StopAfter:
    """kopf's DaemonStopped as the loop reads it: falsy until `passes` checks are done."""

    def __init__(self, passes: int) -> None:
        self.left = passes

    def __bool__(self) -> bool:
        self.left -= 1
        return self.left < 0

    def wait(self, timeout: float) -> Any:
        return asyncio.sleep(timeout)


async def test_a_sleeping_reconcile_loop_ends_as_soon_as_kopf_stops_it() -> None:
    """Within kopf's cancellation timeout (5 s), so a normal delete logs no warning that the
    daemon was cancelled."""
    from types import SimpleNamespace

    from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

    from polyrl.operator import main
    from polyrl.operator.context import Wakers

    setter: FlagSetter[Any] = FlagSetter()
    ctx = SimpleNamespace(wakers=Wakers(), settings=SimpleNamespace(status_interval=30.0))
    passes: list[float] = []

    async def step() -> None:
        passes.append(time.monotonic())

    logger = logging.getLogger("test-loop")
    loop = asyncio.create_task(
        main._loop(ctx, "job", "ns", "j", AsyncFlagWaiter(setter), logger, step)  # type: ignore[arg-type]
    )
    await wait_until_async("the loop's first pass", lambda: passes)  # now it sleeps
    stopped_at = time.monotonic()
    setter.set()
    await asyncio.wait_for(loop, timeout=2)
    assert len(passes) == 1  # it slept after its pass, then ended instead of passing again
    assert time.monotonic() - stopped_at < 1


async def test_a_reconcile_pass_that_raises_is_counted_logged_and_retried() -> None:
    from types import SimpleNamespace

    from prometheus_client import REGISTRY

    from polyrl.operator import main
    from polyrl.operator.context import Wakers

    def errors() -> float:
        found = REGISTRY.get_sample_value(
            "polyrl_operator_reconcile_errors_total", {"kind": "group"}
        )
        return found or 0.0

    calls: list[int] = []

    async def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the API server said 500")

    ctx = SimpleNamespace(wakers=Wakers(), settings=SimpleNamespace(status_interval=0.01))
    before = errors()
    logger = logging.getLogger("test-loop")
    await main._loop(ctx, "group", "ns", "g", StopAfter(2), logger, step)  # type: ignore[arg-type]
    assert len(calls) == 2  # the failed pass was retried, the loop lived on
    assert errors() == before + 1


def test_a_job_the_models_refuse_is_explained_field_by_field() -> None:
    assert refused.problems(JOB) is None
    doc = copy.deepcopy(JOB)
    doc["spec"]["workflow"] = {"task": {"name": "arithmetic", "params": {"digits": [2]}}}
    doc["spec"]["policies"][0]["rollout"] = {"replicas": -1}
    said = refused.problems(doc)
    assert said is not None
    assert "spec.workflow.task.params.digits: Value error, a task param is a number" in said
    assert "spec.policies.0.rollout.replicas: Input should be greater than or equal to 0" in said


async def test_progress_news_wake_a_group_at_once_then_at_most_once_an_interval() -> None:
    from polyrl.operator.context import Wakers

    wakers = Wakers(progress_interval=1.0)
    wakers.remember_pod("ns", "g-rollout-0", "g")
    wakers.remember_pod("ns", "g-trainer-0", "g")
    woken = wakers.event("group", "ns", "g")
    wakes = 0

    async def count_wakes(seconds: float) -> None:
        nonlocal wakes
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline:
            if woken.is_set():
                wakes += 1
                woken.clear()
            await asyncio.sleep(0.01)

    wakers.wake_pod("ns", "g-trainer-0", progress=True)  # the first news: at once
    assert woken.is_set()
    for _ in range(10):  # a trainer stepping fast, replicas following: one wake for them all
        wakers.wake_pod("ns", "g-trainer-0", progress=True)
        wakers.wake_pod("ns", "g-rollout-0", progress=True)
        await count_wakes(0.01)
    await count_wakes(1.2)
    assert wakes == 2
    wakers.wake_pod("ns", "g-rollout-0")  # a state change is never held back
    assert woken.is_set()
