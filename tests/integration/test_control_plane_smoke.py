"""The test control plane is real: CRDs, watches, scale subresource, scheduler, GC, node agent."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.waiting import wait_until

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.polyrl.dev
spec:
  group: smoke.polyrl.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              replicas: {type: integer, minimum: 0}
              colour: {type: string}
          status:
            type: object
            properties:
              replicas: {type: integer}
"""


@pytest.fixture(scope="module")
def widget_crd(kubectl: Kubectl) -> str:
    kubectl.apply(WIDGET_CRD)
    kubectl("wait", "--for=condition=Established", "crd/widgets.smoke.polyrl.dev", "--timeout=30s")
    return "widgets.smoke.polyrl.dev"


def widget(name: str, namespace: str, replicas: int = 1) -> str:
    return (
        f"apiVersion: smoke.polyrl.dev/v1\nkind: Widget\nmetadata:\n  name: {name}\n"
        f"  namespace: {namespace}\nspec:\n  replicas: {replicas}\n  colour: red\n"
    )


def test_a_crd_applied_with_kubectl_is_served(kubectl: Kubectl, widget_crd: str) -> None:
    resources = kubectl("api-resources", "--api-group=smoke.polyrl.dev", "-o", "name").stdout
    assert widget_crd in resources.split()


def test_an_invalid_object_is_rejected_by_the_crd_schema(
    kubectl: Kubectl, widget_crd: str, namespace: str
) -> None:
    bad = widget("bad", namespace).replace("replicas: 1", "replicas: -1")
    proc = kubectl("apply", "-f", "-", input=bad, check=False)
    assert proc.returncode != 0
    assert "spec.replicas" in proc.stderr


def test_an_object_can_be_created_patched_and_watched(
    kubectl: Kubectl, kube_api: client.ApiClient, widget_crd: str, namespace: str
) -> None:
    kubectl.apply(widget("w1", namespace))
    seen: list[tuple[str, str]] = []
    watching = threading.Event()
    custom = client.CustomObjectsApi(kube_api)

    def follow() -> None:
        stream = watch.Watch().stream(
            custom.list_namespaced_custom_object,
            "smoke.polyrl.dev",
            "v1",
            namespace,
            "widgets",
            timeout_seconds=20,
        )
        for event in stream:
            seen.append((event["type"], event["object"]["spec"]["colour"]))
            watching.set()
            if event["object"]["spec"]["colour"] == "blue":
                return

    watcher = threading.Thread(target=follow)
    watcher.start()
    # A watch without a resourceVersion starts with an ADDED event per existing object; one
    # that opened only after the patch would see ("ADDED", "blue") and never a MODIFIED.
    assert watching.wait(timeout=20), "the watch delivered no initial event"
    kubectl(
        "patch", "widget", "w1", "-n", namespace, "--type=merge", "-p", '{"spec":{"colour":"blue"}}'
    )
    watcher.join(timeout=25)
    assert ("MODIFIED", "blue") in seen
    assert kubectl.json("get", "widget", "w1", "-n", namespace)["spec"]["colour"] == "blue"


def test_kubectl_scale_goes_through_the_scale_subresource(
    kubectl: Kubectl, widget_crd: str, namespace: str
) -> None:
    kubectl.apply(widget("w2", namespace, replicas=1))
    kubectl("scale", "widget/w2", "-n", namespace, "--replicas=5")
    scale = kubectl.json("get", "widget", "w2", "-n", namespace, "--subresource=scale")
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 5
    assert kubectl.json("get", "widget", "w2", "-n", namespace)["spec"]["replicas"] == 5


def pod(name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox", "command": command}
    container.update(extra.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container], **extra},
    }


def get_pod(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl.json("get", "pod", name, "-n", namespace)
    return result


def test_the_scheduler_binds_a_pod_to_an_agent_node_and_it_becomes_running(
    kubectl: Kubectl, cluster: Cluster, namespace: str
) -> None:
    kubectl.apply(json.dumps(pod("sleeper", ["sleep", "300"])), "-n", namespace)
    running = wait_until(
        "pod sleeper Running and Ready",
        lambda: (
            p
            if (p := get_pod(kubectl, namespace, "sleeper"))["status"].get("phase") == "Running"
            and condition(p, "Ready") == "True"
            else None
        ),
    )
    # The manifest named no node: the scheduler chose one of the agent's nodes.
    assert running["spec"]["nodeName"] in cluster.node_names
    assert condition(running, "PodScheduled") == "True"
    events = kubectl.json(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=sleeper"
    )["items"]
    assert any(e["reason"] == "Scheduled" for e in events)


def test_a_pod_whose_command_writes_a_file_succeeds(
    kubectl: Kubectl, exec_namespace: str, tmp_path: Path
) -> None:
    target = tmp_path / "out.txt"
    kubectl("create", "secret", "generic", "s", "-n", exec_namespace, "--from-literal=token=t0k")
    spec = pod(
        "writer",
        ["sh", "-c", f'echo "$POD $TOKEN $(GREETING)" > {target}'],
        container={
            "env": [
                {"name": "GREETING", "value": "hello"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
            ]
        },
    )
    kubectl.apply(json.dumps(spec), "-n", exec_namespace)
    done = wait_until(
        "pod writer Succeeded",
        lambda: (
            p
            if (p := get_pod(kubectl, exec_namespace, "writer"))["status"].get("phase")
            in ("Succeeded", "Failed")
            else None
        ),
    )
    assert done["status"]["phase"] == "Succeeded"
    assert target.read_text() == "writer t0k hello\n"
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0


def test_a_pod_whose_command_fails_is_marked_failed_with_its_exit_code(
    kubectl: Kubectl, exec_namespace: str
) -> None:
    kubectl.apply(json.dumps(pod("crasher", ["sh", "-c", "exit 3"])), "-n", exec_namespace)
    done = wait_until(
        "pod crasher Failed",
        lambda: (
            p
            if (p := get_pod(kubectl, exec_namespace, "crasher"))["status"].get("phase") == "Failed"
            else None
        ),
    )
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_deleting_a_running_pod_sends_sigterm_and_completes_the_deletion(
    kubectl: Kubectl, exec_namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / "terminated"
    ready = tmp_path / "trap-installed"
    script = (
        f"trap 'echo bye > {marker}; exit 0' TERM; touch {ready}; while true; do sleep 0.1; done"
    )
    kubectl.apply(json.dumps(pod("graceful", ["sh", "-c", script])), "-n", exec_namespace)
    wait_until(
        "pod graceful Running",
        lambda: get_pod(kubectl, exec_namespace, "graceful")["status"].get("phase") == "Running",
    )
    # The agent reports Running right after it spawns the shell, not once the trap is set.
    wait_until("the shell to install its trap", ready.exists)
    kubectl("delete", "pod", "graceful", "-n", exec_namespace, "--timeout=30s")
    assert marker.read_text() == "bye\n"
    gone = kubectl("get", "pod", "graceful", "-n", exec_namespace, check=False)
    assert "NotFound" in gone.stderr


def test_deleting_an_owner_garbage_collects_its_child(
    kubectl: Kubectl, kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [ref]}}
    )
    kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_until(
        "the child to be garbage-collected",
        lambda: kubectl("get", "configmap", "child", "-n", namespace, check=False).returncode != 0,
    )


@pytest.mark.slow
def test_nodes_stay_ready_past_the_node_monitor_grace_period(
    kubectl: Kubectl, cluster: Cluster
) -> None:
    # The lifecycle controller marks a node NotReady 50 s after its last heartbeat.
    elapsed = time.monotonic() - cluster.started_at  # type: ignore[attr-defined]
    time.sleep(max(0.0, 65 - elapsed))
    for name in cluster.node_names:
        node = kubectl.json("get", "node", name)
        assert condition(node, "Ready") == "True", node["status"]["conditions"]
        assert not node["spec"].get("taints")
        lease = kubectl.json("get", "lease", name, "-n", "kube-node-lease")
        assert lease["spec"]["holderIdentity"] == name
