"""A job's whole life under the operator: checkpoint claims, completion, failures reported
with their cause, no leaks after deletion, quick restarts, and a guard against stale CRDs.

Pods run the FAKE worker here (its trainer steps to the last step, says it is done and
exits 0), or are only marked Running; what needs the real workers is in
test_bad_input.py and the end-to-end tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator_stack import operator_process

from polyrl.api import crds
from polyrl.local import processes
from polyrl.local.natsserver import NatsServer
from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.waiting import wait_until

from .conftest import OperatorProcess
from .helpers import (
    apply,
    events,
    fail_pod,
    get,
    job_doc,
    live,
    pods,
    two_more_passes,
    wait_running,
)


def claim_names(kubectl: Kubectl, ns: str) -> list[str]:
    items = kubectl.json("get", "pvc", "-n", ns)["items"]
    return sorted(
        c["metadata"]["name"] for c in items if not c["metadata"].get("deletionTimestamp")
    )


def test_each_policy_gets_a_checkpoint_claim_that_its_first_trainer_pod_mounts(
    kubectl: Kubectl, ns: str
) -> None:
    doc = job_doc("ckpt")
    doc["spec"]["policies"].append(
        {
            "name": "judge",
            "model": {"path": "tiny-llama://j"},
            "trainer": {"checkpoint": {"whenDeleted": "Delete", "size": "1Gi"}},
        }
    )
    apply(kubectl, ns, doc)
    wait_until(
        "both claims",
        lambda: claim_names(kubectl, ns) == ["ckpt-judge-checkpoints", "ckpt-solver-checkpoints"],
    )
    job = get(kubectl, ns, "rlj", "ckpt")
    kept = get(kubectl, ns, "pvc", "ckpt-solver-checkpoints")
    owned = get(kubectl, ns, "pvc", "ckpt-judge-checkpoints")
    assert "ownerReferences" not in kept["metadata"]  # Retain, the default
    assert owned["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert owned["spec"]["resources"]["requests"]["storage"] == "1Gi"
    wait_running(kubectl, ns, "polyrl.dev/policy-group=ckpt-solver,polyrl.dev/role=trainer", 1)
    trainer = get(kubectl, ns, "pod", "ckpt-solver-trainer-0")
    volumes = {v["name"]: v for v in trainer["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "ckpt-solver-checkpoints"
    env = {e["name"]: e.get("value") for e in trainer["spec"]["containers"][0]["env"]}
    assert env["POLYRL_TRAINER_DIR"] == f"/var/lib/polyrl/{job['metadata']['uid']}"
    status = wait_until(
        "the outputs in status",
        lambda: (
            s if (s := get(kubectl, ns, "rlj", "ckpt").get("status", {})).get("policies") else None
        ),
    )
    outputs = {p["name"]: p["output"] for p in status["policies"]}
    uid = job["metadata"]["uid"]
    assert outputs["solver"] == f"pvc://ckpt-solver-checkpoints/{uid}/{ns}/ckpt/solver/checkpoint"

    kubectl("delete", "rlj", "ckpt", "-n", ns)
    wait_until(
        "the Delete claim collected with its job",
        lambda: claim_names(kubectl, ns) == ["ckpt-solver-checkpoints"],
    )


def test_a_job_whose_trainers_finish_succeeds_with_its_final_figures_and_frees_its_pods(
    kubectl: Kubectl, exec_ns: str
) -> None:
    ns = exec_ns
    doc = job_doc("finish", stop={"steps": 6})
    doc["spec"]["policies"][0]["trainer"] = {"steps": 4}
    doc["spec"]["policies"].append({"name": "judge", "model": {"path": "tiny-llama://j"}})
    apply(kubectl, ns, doc)

    def ended() -> dict[str, Any] | None:
        job = get(kubectl, ns, "rlj", "finish")
        return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    job = wait_until("the job to end", ended, timeout=90)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert condition(job, "Complete") == "True"
    figures = {p["name"]: (p["step"], p["completed"]) for p in status["policies"]}
    assert figures == {"solver": (4, True), "judge": (6, True)}  # final steps, kept
    shown = {p["name"]: (p["progress"], p["eta"]) for p in status["policies"]}
    assert shown == {"solver": ("4/4 (100%)", "0s"), "judge": ("6/6 (100%)", "0s")}
    assert (status["progress"], status["eta"]) == ("4/4 (100%)", "0s")
    for group in ("finish-solver", "finish-judge"):

        def freed(group: str = group) -> dict[str, Any] | None:
            """The group's pass after the job ended: its conditions say no pods run."""
            pg = get(kubectl, ns, "pg", group)
            said = {c["type"]: c for c in pg["status"]["conditions"]}
            rollouts = said.get("RolloutsReady", {})
            return pg if rollouts.get("reason") == "Succeeded" else None

        pg = wait_until(f"{group}: RolloutsReady says the job ended", freed)
        healthy = next(c for c in pg["status"]["conditions"] if c["type"] == "TrainerHealthy")
        assert (healthy["status"], healthy["reason"]) == ("True", "Completed")  # not "Starting"
        rollouts = next(c for c in pg["status"]["conditions"] if c["type"] == "RolloutsReady")
        assert rollouts["status"] == "False"
        assert "no pods run" in rollouts["message"]  # not "1/1 rollout pods ready"
        assert pg["status"]["weightVersion"] == pg["status"]["step"]  # the fake's version
    wait_until(
        "every pod freed", lambda: not live(pods(kubectl, ns, "polyrl.dev/job=finish")), timeout=60
    )


def test_a_failing_workflow_runner_is_replaced_with_backoff_under_one_aggregated_event(
    kubectl: Kubectl, ns: str
) -> None:
    apply(kubectl, ns, job_doc("flaky"))
    runner = "flaky-workflow-0"
    seen: list[str] = []
    for _ in range(3):
        uid = wait_until(
            "a workflow runner Running",
            lambda: (
                p["metadata"]["uid"]
                if (p := next(iter(live(pods(kubectl, ns, "polyrl.dev/role=workflow"))), None))
                and p["status"].get("phase") == "Running"
                and p["metadata"]["uid"] not in seen
                else None
            ),
            timeout=30,
        )
        seen.append(uid)
        fail_pod(kubectl, ns, runner, code=1)
    job = get(kubectl, ns, "rlj", "flaky")
    assert job["status"]["workflowFailures"] >= 2
    assert condition(job, "WorkersHealthy") == "False"
    assert job["status"]["lastFailure"] == "workflow pod flaky-workflow-0 failed: exit 1"
    failed = [e for e in events(kubectl, ns, "flaky") if e["reason"] == "WorkflowRunnerFailed"]
    assert len(failed) == 1, failed  # one event, counted, not one per failure
    wait_until(
        "its count to reach 3",
        lambda: (
            next(e for e in events(kubectl, ns, "flaky") if e["reason"] == "WorkflowRunnerFailed")[
                "count"
            ]
            >= 3
        ),
    )


def test_scaling_down_deletes_pods_that_never_served_at_once(kubectl: Kubectl, ns: str) -> None:
    # Pods here are only marked Running: no worker ever heartbeats "serving", so there is
    # nothing to drain (before, each waited out its drain timeout).
    doc = job_doc("idle", rollout={"replicas": 3, "drainTimeoutSeconds": 60})
    apply(kubectl, ns, doc)
    selector = "polyrl.dev/policy-group=idle-solver,polyrl.dev/role=rollout"
    wait_running(kubectl, ns, selector, 3)
    started = time.monotonic()
    kubectl("scale", "pg", "idle-solver", "-n", ns, "--replicas=1")
    wait_until("two pods deleted", lambda: len(live(pods(kubectl, ns, selector))) == 1, timeout=20)
    seconds = time.monotonic() - started
    print(f"scale-down of 2 never-serving pods: {seconds:.1f}s")
    assert seconds < 15  # the drain timeout is 60 s

    def said_why() -> bool:  # the operator posts its events after the deletions it reports
        deleted = [e for e in events(kubectl, ns, "idle-solver") if e["reason"] == "Deleted"]
        return any("never served" in e["message"] for e in deleted)

    wait_until("a Deleted event saying the pods never served", said_why, timeout=30)


def connz(server: NatsServer) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{server.monitor_port}/connz?subs=1&limit=1024"
    with urllib.request.urlopen(url, timeout=5) as resp:
        found: list[dict[str, Any]] = json.loads(resp.read())["connections"]
        return found


def operator_subs(server: NatsServer) -> int:
    """Subscriptions of the operator's NATS connections (it names them polyrl-operator)."""
    return sum(
        len(c.get("subscriptions_list") or [])
        for c in connz(server)
        if c.get("name") == "polyrl-operator"
    )


def test_deleting_jobs_closes_every_subscription_they_opened(
    kubectl: Kubectl, ns: str, nats_server: NatsServer, operator: OperatorProcess
) -> None:
    before = operator_subs(nats_server)
    names = [f"leak-{i}" for i in range(10)]
    for name in names:
        apply(kubectl, ns, job_doc(name))
    wait_until("the jobs' watchers", lambda: operator_subs(nats_server) >= before + 20, timeout=60)
    for name in names:
        kubectl("delete", "rlj", name, "-n", ns, "--wait=false")
    wait_until(
        "the operator back to its subscriptions before the jobs",
        lambda: operator_subs(nats_server) == before,
        timeout=30,
    )
    # A watcher left running logged "stream not found" every 10 s: three periods of quiet,
    # then two passes of an object that outlives the jobs show the operator was at work all
    # along (a group of no job: it reconciles, with no NATS of its own).
    mark = len(operator.log())
    witness = {
        "apiVersion": "polyrl.dev/v1alpha1",
        "kind": "PolicyGroup",
        "metadata": {"name": "witness"},
        "spec": {"jobRef": "absent", "policy": "solver", "rollout": {"replicas": 1}},
    }
    apply(kubectl, ns, witness)
    time.sleep(30)
    two_more_passes(kubectl, operator, "policygroup")
    assert "stream not found" not in operator.log()[mark:]


def test_an_operator_killed_with_sigkill_is_replaced_by_one_that_acts_without_its_lease_expiring(
    kubectl: Kubectl, ns: str, operator: OperatorProcess
) -> None:
    """The dead operator's peering record would pause a successor for kopf's peering
    lifetime (60 s); the newest operator outranks it and acts as soon as it has started
    (under 10 s on a quiet machine; the bound below leaves room for a loaded one)."""
    assert operator.proc is not None
    os.kill(operator.proc.pid, signal.SIGKILL)
    processes.stop(operator.proc, grace=0)
    operator.proc = None
    started = time.monotonic()
    operator.start()
    apply(kubectl, ns, job_doc("after-kill"))
    wait_until(
        "the new operator to act", lambda: kubectl.json("get", "pg", "-n", ns)["items"], timeout=45
    )
    seconds = time.monotonic() - started
    print(f"from the restarted operator's start to its first PolicyGroup: {seconds:.1f}s")
    assert seconds < 45  # well inside the 60 s it would have waited for the dead one's lease
    assert "Pausing" not in operator.log()


def test_an_operator_refuses_to_start_against_crds_of_another_schema(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    crd = "rljobs.polyrl.dev"
    key = crds.SCHEMA_HASH
    expected = crds.schema_hashes()[crd]
    kubectl("annotate", "crd", crd, f"{key}=0ld5chema", "--overwrite")
    try:
        other = operator_process(operator.kubeconfig, operator.nats_url, tmp_path)
        log = tmp_path / "stale.log"
        proc = processes.start(
            "stale-operator",
            [sys.executable, "-m", "polyrl.operator", "--peering", "polyrl-stale"],
            log=log,
            env=other.env(),
        )
        assert proc.popen is not None
        assert proc.popen.wait(timeout=60) == 3
        text = log.read_text()
        assert f"CRD {crd} has schema 0ld5chema, this operator needs {expected}" in text
        assert "kubectl apply --server-side -f crds/" in text
        said = kubectl.json(
            "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={crd}"
        )
        assert any(e["reason"] == "SchemaMismatch" for e in said["items"])
    finally:
        kubectl("annotate", "crd", crd, f"{key}={expected}", "--overwrite")


@pytest.mark.parametrize("field", [{"whenDeleted": "Sometimes"}, {"claimName": "Not_A_Name"}])
def test_an_invalid_checkpoint_setting_is_refused_by_the_api_server(
    kubectl: Kubectl, ns: str, field: dict[str, str]
) -> None:
    doc = job_doc("bad-ckpt")
    doc["spec"]["policies"][0]["trainer"] = {"checkpoint": field}
    proc = kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0
    assert "checkpoint" in proc.stderr
