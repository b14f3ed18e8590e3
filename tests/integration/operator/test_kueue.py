"""Kueue itself on the test control plane: built from its Go module, its webhooks called by
the API server on loopback, admitting pod groups against a ClusterQueue's quota."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from polyrl.api import queueing
from polyrl.testing.kube import Kubectl
from polyrl.testing.kueue import MANAGED_LABEL, Kueue, queues
from polyrl.testing.waiting import wait_until

from .helpers import apply, condition_of, job_doc, live, pods, reasons, wait_condition

pytestmark = pytest.mark.kueue


def pod_group(name: str, size: int, *, cpu: str, seconds: int = 3600) -> str:
    """`size` pods that Kueue admits as one Workload, each asking for `cpu` and running
    for `seconds`."""
    pods = [
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}-{i}
  labels:
    kueue.x-k8s.io/queue-name: work
    kueue.x-k8s.io/pod-group-name: {name}
  annotations:
    kueue.x-k8s.io/pod-group-total-count: "{size}"
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: polyrl/idle
    command: [sleep, "{seconds}"]
    resources: {{requests: {{cpu: "{cpu}", memory: 64Mi}}}}
"""
        for i in range(size)
    ]
    return "---".join(pods)


def group_pods(kubectl: Kubectl, namespace: str, group: str) -> list[dict[str, Any]]:
    selector = f"kueue.x-k8s.io/pod-group-name={group}"
    items: list[dict[str, Any]] = kubectl.json("get", "pods", "-n", namespace, "-l", selector)[
        "items"
    ]
    return items


gated = queueing.gated


def scheduled(kubectl: Kubectl, namespace: str, group: str, size: int) -> bool:
    found = group_pods(kubectl, namespace, group)
    return len(found) == size and all(not gated(p) and p["spec"].get("nodeName") for p in found)


def test_kueue_admits_a_pod_group_whole_within_quota_and_the_next_once_quota_frees(
    kubectl: Kubectl, kueue: Kueue, kueue_namespace: str
) -> None:
    ns = kueue_namespace
    kubectl.apply(queues(ns, cpu=2))
    kubectl.apply(pod_group("first", 2, cpu="1", seconds=8), "-n", ns)
    wait_until("the first group admitted and scheduled", lambda: scheduled(kubectl, ns, "first", 2))

    kubectl.apply(pod_group("second", 2, cpu="1"), "-n", ns)
    wait_until(
        "a Workload for the second group",
        lambda: any(
            "second" in w["metadata"]["name"]
            for w in kubectl.json("get", "workloads.kueue.x-k8s.io", "-n", ns)["items"]
        ),
    )
    waiting = group_pods(kubectl, ns, "second")
    assert len(waiting) == 2
    assert all(gated(p) and not p["spec"].get("nodeName") for p in waiting)

    wait_until(  # the first group's pods end (Succeeded): its Workload finishes
        "the second group admitted once the first finished",
        lambda: scheduled(kubectl, ns, "second", 2),
        timeout=60,
    )


def test_pods_outside_kueues_namespaces_never_meet_its_webhooks(
    kubectl: Kubectl, kueue: Kueue, namespace: str
) -> None:
    """The shared test cluster's other namespaces: a pod with a queue label is not gated."""
    kubectl.apply(pod_group("free", 1, cpu="1"), "-n", namespace)
    [pod] = group_pods(kubectl, namespace, "free")
    assert not gated(pod)


@pytest.fixture
def queued_ns(kubectl: Kubectl, kueue: Kueue, ns: str) -> str:
    """The operator's restricted namespace (pods only marked Running), managed by Kueue."""
    kubectl("label", "namespace", ns, f"{MANAGED_LABEL}=true")
    return ns


def queued_job(name: str) -> dict[str, Any]:
    """Runner, trainer and one rollout (the minimum): a gang of 3 pods of 1 CPU each."""
    doc = job_doc(name, rollout={"replicas": 1, "minReplicas": 1})
    doc["metadata"]["labels"] = {queueing.QUEUE_LABEL: "work"}
    return doc


def job_pods(kubectl: Kubectl, ns: str, job: str) -> list[dict[str, Any]]:
    return live(pods(kubectl, ns, f"polyrl.dev/job={job}"))


def all_scheduled(kubectl: Kubectl, ns: str, job: str, count: int) -> bool:
    found = job_pods(kubectl, ns, job)
    return len(found) == count and all(not gated(p) and p["spec"].get("nodeName") for p in found)


def test_a_queued_job_starts_no_pod_before_its_gang_is_admitted_whole_and_waits_for_quota(
    kubectl: Kubectl, queued_ns: str
) -> None:
    ns = queued_ns
    local = "{topology.kubernetes.io/region: local}"  # the flavor: polyrl-node-0's region
    kubectl.apply(queues(ns, cpu=4, flavor="local-flavor", node_labels=local))
    apply(kubectl, ns, queued_job("first"))
    wait_condition(kubectl, ns, "rljob", "first", "Admitted", "Admitted", timeout=60)
    wait_until("the first job's gang scheduled", lambda: all_scheduled(kubectl, ns, "first", 3))
    gang = job_pods(kubectl, ns, "first")
    assert {p["metadata"]["annotations"][queueing.TOTAL_ANNOTATION] for p in gang} == {"3"}
    assert all(
        p["spec"]["containers"][0]["resources"]["requests"] == queueing.DEFAULT_REQUESTS
        for p in gang
    )
    for pod in gang:  # the admitted flavor's node labels land on the pods
        assert pod["spec"]["nodeSelector"]["topology.kubernetes.io/region"] == "local"
        assert pod["spec"]["nodeName"] == "polyrl-node-0"

    apply(kubectl, ns, queued_job("second"))  # 3 more CPUs: 1 is left
    job = wait_condition(kubectl, ns, "rljob", "second", "Admitted", "Pending", timeout=60)
    message = next(c for c in job["status"]["conditions"] if c["type"] == "Admitted")["message"]
    assert "insufficient unused quota" in message
    waiting = job_pods(kubectl, ns, "second")
    assert len(waiting) == 3
    assert all(gated(p) and not p["spec"].get("nodeName") for p in waiting)
    wait_until("an event", lambda: "WaitingForAdmission" in reasons(kubectl, ns, "second"))

    kubectl("patch", "rljob", "first", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_condition(kubectl, ns, "rljob", "first", "Suspended", "SuspendedByUser")
    wait_condition(kubectl, ns, "rljob", "second", "Admitted", "Admitted", timeout=90)
    wait_until("the second job's gang scheduled", lambda: all_scheduled(kubectl, ns, "second", 3))
    wait_until("an event", lambda: "Admitted" in reasons(kubectl, ns, "second"))


def test_rollouts_above_the_minimum_are_admitted_one_by_one_within_quota(
    kubectl: Kubectl, queued_ns: str
) -> None:
    ns = queued_ns
    kubectl.apply(queues(ns, cpu=4))
    apply(kubectl, ns, queued_job("elastic"))
    wait_until("the gang scheduled", lambda: all_scheduled(kubectl, ns, "elastic", 3))
    kubectl("scale", "pg", "elastic-solver", "-n", ns, "--replicas=3")
    rollouts = "polyrl.dev/policy-group=elastic-solver,polyrl.dev/role=rollout"

    def split() -> tuple[list[str], list[str]] | None:
        found = live(pods(kubectl, ns, rollouts))
        admitted = sorted(p["metadata"]["name"] for p in found if p["spec"].get("nodeName"))
        held = sorted(p["metadata"]["name"] for p in found if gated(p))
        return (admitted, held) if len(admitted) == 2 and len(held) == 1 else None

    admitted, _held = wait_until("one more rollout admitted and one held", split, timeout=60)
    assert "elastic-solver-rollout-0" in admitted  # the gang's own is never in question
    kubectl("scale", "pg", "elastic-solver", "-n", ns, "--replicas=1")
    wait_until(
        "the extra rollouts gone",
        lambda: len(live(pods(kubectl, ns, rollouts))) == 1,
        timeout=60,
    )


# A start-up deadline short enough for a test: 8 s to all pods ready, one re-queue 1 s later,
# then the Workload is deactivated.
PODS_READY = {
    "timeout": "8s",
    "requeuingStrategy": {"backoffLimitCount": 1, "backoffBaseSeconds": 1, "backoffMaxSeconds": 2},
}


@pytest.fixture
def pods_ready_deadline(kueue: Kueue) -> Iterator[Kueue]:
    """Kueue with `waitForPodsReady` (PODS_READY) for one test, then as it was."""
    kueue.restart(wait_for_pods_ready=PODS_READY)
    try:
        yield kueue
    finally:
        kueue.restart(wait_for_pods_ready=None)


def test_a_trainer_gang_that_cannot_start_is_evicted_at_kueues_deadline_and_says_why(
    kubectl: Kubectl, queued_ns: str, pods_ready_deadline: Kueue
) -> None:
    """The trainer asks for nodes no node matches: Kueue admits the gang (quota fits), the
    trainer pod stays unschedulable, and once waitForPodsReady's timeout passes Kueue evicts
    the gang, re-queues it once and then deactivates it. The PolicyGroup says why the trainer
    does not start; the job says what Kueue did."""
    ns = queued_ns
    kubectl.apply(queues(ns, cpu=4))
    doc = queued_job("stuck")
    doc["spec"]["policies"][0]["trainer"] = {"nodeSelector": {"polyrl.dev/accelerator": "none"}}
    apply(kubectl, ns, doc)
    wait_condition(kubectl, ns, "rljob", "stuck", "Admitted", "Admitted", timeout=60)
    group = wait_condition(kubectl, ns, "pg", "stuck-solver", "TrainerHealthy", "Unschedulable")
    said = condition_of(group, "TrainerHealthy") or {}
    assert said["status"] == "False"
    assert "stuck-solver-trainer-0" in said["message"]
    assert "node" in said["message"]  # the scheduler's words: no node matches its selector

    job = wait_condition(kubectl, ns, "rljob", "stuck", "Suspended", "PodsReadyTimeout")
    assert "PodsReady timeout" in (condition_of(job, "Suspended") or {})["message"]
    wait_until(  # once its pods are gone, Kueue takes the admission (and quota) back
        "the job no longer admitted",
        lambda: (
            (condition_of(kubectl.json("get", "rljob", "stuck", "-n", ns), "Admitted") or {}).get(
                "status"
            )
            == "False"
        ),
    )
    wait_until("an event", lambda: "WaitingForAdmission" in reasons(kubectl, ns, "stuck"))

    def deactivated() -> dict[str, Any] | None:
        found = kubectl.json("get", "rljob", "stuck", "-n", ns)
        said = condition_of(found, "Suspended") or {}
        return found if "re-queuing" in said.get("message", "") else None

    job = wait_until("Kueue deactivates the gang after its one re-queue", deactivated, timeout=60)
    assert (condition_of(job, "Suspended") or {})["status"] == "True"

    # Made again, behind the gate, and held there: the pods of the evicted attempt may still
    # be going when the Workload is deactivated, so wait for the operator's new ones.
    def all_held() -> list[dict[str, Any]] | None:
        found = job_pods(kubectl, ns, "stuck")
        return found if found and all(gated(p) for p in found) else None

    held = wait_until("every pod made again behind the gate", all_held, timeout=30)
    assert all(gated(p) for p in held)
