"""The pod statuses a kubelet would post, as plain dicts for a strategic-merge patch.

Conditions merge by `type` and container statuses by `name`, so each patch carries the
whole picture of what it changes and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polyrl.api.base import now_rfc3339

HOST_IP = "127.0.0.1"


def stamp() -> str:
    return now_rfc3339()


@dataclass(slots=True)
class ContainerState:
    """What we know of one container: running since, or exited with a code."""

    name: str
    image: str
    started_at: str | None = None
    exit_code: int | None = None
    finished_at: str | None = None
    reason: str = ""
    message: str = ""
    restarts: int = 0
    pid: int | None = None
    ready: bool = True  # False while a readiness probe has not passed (or has failed)
    started: bool = True  # False until a startup probe has passed
    last: dict[str, Any] | None = None  # the previous instance's terminated state

    def to_status(self) -> dict[str, Any]:
        if self.exit_code is not None:
            state: dict[str, Any] = {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": self.reason or ("Completed" if self.exit_code == 0 else "Error"),
                    "message": self.message,
                    "startedAt": self.started_at or self.finished_at,
                    "finishedAt": self.finished_at,
                }
            }
        elif self.started_at is not None:
            state = {"running": {"startedAt": self.started_at}}
        else:
            state = {
                "waiting": {"reason": self.reason or "ContainerCreating", "message": self.message}
            }
        running = "running" in state
        status = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "containerID": f"polyrl://{self.pid}" if self.pid else "",
            "ready": running and self.ready and self.started,
            "started": running and self.started,
            "restartCount": self.restarts,
            "state": state,
        }
        if self.last is not None:
            status["lastState"] = {"terminated": self.last}
        return status

    def back_off(self, seconds: float) -> None:
        """The finished instance becomes lastState; the container waits to restart."""
        self.last = self.to_status()["state"].get("terminated")
        self.exit_code = self.finished_at = self.started_at = None
        self.reason = "CrashLoopBackOff"
        self.message = f"back-off {seconds:g}s restarting failed container={self.name}"


def _condition(kind: str, ok: bool, reason: str = "") -> dict[str, str | None]:
    # A strategic merge keeps fields the patch does not name: None clears an old reason.
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "lastTransitionTime": stamp(),
        "reason": reason or None,
    }


def pod_status(
    phase: str,
    containers: Sequence[ContainerState],
    *,
    start_time: str,
    pod_ip: str = HOST_IP,
    reason: str = "",
    message: str = "",
) -> dict[str, Any]:
    """A full pod status for `phase` (Pending, Running, Succeeded or Failed)."""
    ready = phase == "Running" and all(
        c.started_at and c.exit_code is None and c.ready and c.started for c in containers
    )
    not_ready = "" if ready else ("PodCompleted" if phase != "Running" else "ContainersNotReady")
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "conditions": [
            _condition("PodReadyToStartContainers", True),
            _condition("Initialized", True),
            _condition("ContainersReady", ready, not_ready),
            _condition("Ready", ready, not_ready),
        ],
        "containerStatuses": [c.to_status() for c in containers],
    }
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return status


def final_phase(containers: Sequence[ContainerState]) -> str:
    return "Succeeded" if all(c.exit_code == 0 for c in containers) else "Failed"


def containers_of(pod: Mapping[str, Any]) -> list[ContainerState]:
    return [
        ContainerState(name=c["name"], image=c.get("image", "")) for c in pod["spec"]["containers"]
    ]
