"""What the operator remembers of each pod it manages (the in-memory index's values).

Built from watch events by a kopf index, so reconciling reads memory, not the API server:
an idle job costs no API traffic beyond its status timer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polyrl.api import naming


@dataclass(frozen=True, slots=True)
class PodInfo:
    name: str
    namespace: str
    uid: str
    role: str
    replica: int
    policy: str | None
    group: str | None
    phase: str
    ready: bool
    deleting: bool
    draining: bool
    drain_started: float | None
    created: str
    spec_hash: str
    problem: tuple[str, str] | None  # (reason, message) when the pod cannot run

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def active(self) -> bool:
        """Counts toward replicas: alive, not leaving."""
        return not (self.terminal or self.deleting or self.draining)


def _problem(status: Mapping[str, Any]) -> tuple[str, str] | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return (cond.get("reason") or "Unschedulable", cond.get("message") or "")
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in (
            "ErrImagePull",
            "ImagePullBackOff",
            "InvalidImageName",
            "CreateContainerConfigError",
            "CrashLoopBackOff",
        ):
            return (waiting["reason"], waiting.get("message") or "")
    return None


def from_body(body: Mapping[str, Any]) -> PodInfo:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    drain = annotations.get(naming.A_DRAIN_STARTED)
    return PodInfo(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid", ""),
        role=labels.get(naming.L_ROLE, ""),
        replica=int(labels.get(naming.L_REPLICA, "0")),
        policy=labels.get(naming.L_POLICY),
        group=labels.get(naming.L_GROUP),
        phase=status.get("phase") or "Pending",
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        draining=naming.L_DRAINING in labels,
        drain_started=float(drain) if drain else None,
        created=meta.get("creationTimestamp") or "",
        spec_hash=annotations.get(naming.A_SPEC_HASH, ""),
        problem=_problem(status),
    )
