"""Registering nodes and keeping them Ready, as a kubelet's node-status loop does.

Leases are the heartbeat the node lifecycle controller watches (renewed every 10 s with a
40 s duration); the Ready condition in the Node's status is refreshed less often, as the
kubelet's `nodeStatusReportFrequency` does.
"""

from __future__ import annotations

import platform
import uuid
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from polyrl.api.base import now_rfc3339

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
AGENT_VERSION = "polyrl-node-agent://0.1"


@dataclass(slots=True)
class NodeSpec:
    """One node to register: its name, extra labels and advertised capacity."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(
        default_factory=lambda: {
            "cpu": "32",
            "memory": "128Gi",
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }
    )

    @classmethod
    def parse(cls, text: str) -> NodeSpec:
        """`name[,key=value...]`; keys with a `/` or plain names become labels, except
        `capacity.<resource>=<qty>` which sets capacity (e.g. capacity.nvidia.com/gpu=8)."""
        name, *pairs = text.split(",")
        spec = cls(name=name)
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValueError(f"node option {pair!r} is not key=value")
            if key.startswith("capacity."):
                spec.capacity[key.removeprefix("capacity.")] = value
            else:
                spec.labels[key] = value
        return spec


def _conditions(stamp: str, *, transition: bool = True) -> list[dict[str, str]]:
    """Node conditions; a refresh leaves lastTransitionTime alone (strategic merge by type)."""
    quiet = {
        "MemoryPressure": "KubeletHasSufficientMemory",
        "DiskPressure": "KubeletHasNoDiskPressure",
        "PIDPressure": "KubeletHasSufficientPID",
    }
    conds = [
        {"type": t, "status": "False", "reason": r, "message": "node agent"}
        for t, r in quiet.items()
    ]
    conds.append(
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "polyrl node agent is posting ready status",
        }
    )
    for cond in conds:
        cond["lastHeartbeatTime"] = stamp
        if transition:
            cond["lastTransitionTime"] = stamp
    return conds


def node_status(spec: NodeSpec, kube_version: str, kubelet_port: int = 0) -> dict[str, Any]:
    stamp = now_rfc3339()
    return {
        "capacity": spec.capacity,
        "allocatable": spec.capacity,
        "conditions": _conditions(stamp),
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": spec.name},
        ],
        # Where the API server fetches container logs (`kubectl logs`): the agent's
        # kubelet API, at the InternalIP the API server is told to prefer.
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, spec.name).hex,
            "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, spec.name)),
            "bootID": str(uuid.uuid4()),
            "kernelVersion": platform.release(),
            "osImage": "polyrl node agent (no container runtime)",
            "containerRuntimeVersion": AGENT_VERSION,
            "kubeletVersion": kube_version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def register(
    core: client.CoreV1Api,
    spec: NodeSpec,
    kube_version: str,
    *,
    kubelet_port: int = 0,
    pod_cidr: str | None = None,
) -> None:
    """Create the Node (or adopt an existing one) and post a Ready status."""
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **spec.labels,
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
    }
    if pod_cidr:  # immutable once set: an adopted node keeps the one it has
        body["spec"] = {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]}
    try:
        core.create_node(body)
    except ApiException as err:
        if err.status != 409:
            raise
        core.patch_node(spec.name, {"metadata": {"labels": labels}})
    core.patch_node_status(spec.name, {"status": node_status(spec, kube_version, kubelet_port)})


def renew_lease(coord: client.CoordinationV1Api, name: str) -> None:
    """Create or renew the node's Lease, the heartbeat the lifecycle controller reads."""
    stamp = now_rfc3339(micro=True)
    body = {
        "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": stamp},
    }
    try:
        coord.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": body["spec"]})
    except ApiException as err:
        if err.status != 404:
            raise
        coord.create_namespaced_lease(LEASE_NAMESPACE, body)


def refresh_ready(core: client.CoreV1Api, name: str) -> None:
    stamp = now_rfc3339()
    core.patch_node_status(name, {"status": {"conditions": _conditions(stamp, transition=False)}})
