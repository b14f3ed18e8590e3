"""What the operator remembers of each pod it manages (the in-memory index's values).

Built from watch events by a kopf index, so reconciling reads memory, not the API server:
an idle job costs no API traffic beyond its status timer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polyrl.api import naming
from polyrl.api.launch import EXIT_INVALID_INPUT, INVALID_INPUT_PREFIX


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
    exit_code: int | None = None  # of its container, once it terminated
    message: str = ""  # the container's termination message (why it stopped), or the pod's
    finalizers: tuple[str, ...] = ()
    # Kueue stopped it (preempted, suspended by the queue): not a failure of the pod
    stopped_by_queue: bool = False

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def invalid_input(self) -> bool:
        """The worker refused its input (exit 2, or said so first thing in its termination
        message): running it again cannot help."""
        said = self.exit_code == EXIT_INVALID_INPUT or INVALID_INPUT_PREFIX in self.message
        return self.phase == "Failed" and said

    def failure(self) -> str:
        """What a failed pod said, for conditions and events: exit code and message."""
        lines = self.message.strip().splitlines()
        said = [x for x in lines if x.startswith(INVALID_INPUT_PREFIX)] or lines
        why = said[-1].removeprefix(INVALID_INPUT_PREFIX) if said else "no message"
        how = "failed" if self.exit_code is None else f"exited {self.exit_code}"
        return f"{self.role} pod {self.name} {how}: {why}"

    @property
    def active(self) -> bool:
        """Counts toward replicas: alive, not leaving."""
        return not (self.terminal or self.deleting or self.draining)


QUEUE_STOPPED = "TerminationTarget"  # the pod condition Kueue sets on a pod it stops


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


def _terminated(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """The first container's terminated state: now, or its last one if it was restarted."""
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        found = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if found:
            return dict(found)
    return {}


def from_body(body: Mapping[str, Any]) -> PodInfo:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    drain = annotations.get(naming.A_DRAIN_STARTED)
    terminated = _terminated(status)
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
        exit_code=terminated.get("exitCode"),
        message=(terminated.get("message") or status.get("message") or "")[:2048],
        finalizers=tuple(meta.get("finalizers") or ()),
        stopped_by_queue=any(
            c.get("type") == QUEUE_STOPPED and c.get("status") == "True"
            for c in status.get("conditions") or []
        ),
    )
