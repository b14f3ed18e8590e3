"""Kueue itself on the test control plane: built from its Go module, its webhooks called by
the API server on loopback, admitting pod groups against a ClusterQueue's quota."""

from __future__ import annotations

from typing import Any

import pytest

from polyrl.testing.kube import Kubectl
from polyrl.testing.kueue import Kueue
from polyrl.testing.waiting import wait_until

pytestmark = pytest.mark.kueue

GATE = "kueue.x-k8s.io/admission"


def queues(namespace: str, *, cpu: int) -> str:
    """A flavor, a ClusterQueue with `cpu` cores of quota for `namespace`, its LocalQueue."""
    return f"""
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{name: default-flavor}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{name: cq-{namespace}}}
spec:
  namespaceSelector:
    matchLabels: {{kubernetes.io/metadata.name: {namespace}}}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default-flavor
      resources:
      - {{name: cpu, nominalQuota: {cpu}}}
      - {{name: memory, nominalQuota: 16Gi}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{namespace: {namespace}, name: work}}
spec: {{clusterQueue: cq-{namespace}}}
"""


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


def pods(kubectl: Kubectl, namespace: str, group: str) -> list[dict[str, Any]]:
    selector = f"kueue.x-k8s.io/pod-group-name={group}"
    items: list[dict[str, Any]] = kubectl.json("get", "pods", "-n", namespace, "-l", selector)[
        "items"
    ]
    return items


def gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] == GATE for g in pod["spec"].get("schedulingGates") or [])


def scheduled(kubectl: Kubectl, namespace: str, group: str, size: int) -> bool:
    found = pods(kubectl, namespace, group)
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
    waiting = pods(kubectl, ns, "second")
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
    [pod] = pods(kubectl, namespace, "free")
    assert not gated(pod)
