"""Small readers and waiters shared by the operator's acceptance tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
PLURALS = {"rljob": "rljobs", "policygroup": "policygroups"}


def job_doc(name: str, *, rollout: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    rollout = {"replicas": 1, "drainTimeoutSeconds": 3, **(rollout or {})}
    return {
        "apiVersion": "polyrl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "policies": [
                {"name": "solver", "model": {"path": "tiny-llama://s"}, "rollout": rollout}
            ],
            **spec,
        },
    }


def apply(kubectl: Kubectl, ns: str, doc: dict[str, Any]) -> None:
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))


def pods(kubectl: Kubectl, ns: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json("get", "pods", "-n", ns, "-l", selector)["items"]
    return items


def live(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def running_names(kubectl: Kubectl, ns: str, selector: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in live(pods(kubectl, ns, selector))
        if p["status"].get("phase") == "Running"
        and "polyrl.dev/draining" not in p["metadata"].get("labels", {})
    )


def ready_names(kubectl: Kubectl, ns: str, selector: str) -> list[str]:
    """Live pods whose Ready condition is True: what the operator's scale-down order reads."""
    return sorted(
        p["metadata"]["name"]
        for p in live(pods(kubectl, ns, selector))
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in p["status"].get("conditions") or []
        )
    )


def wait_ready(
    kubectl: Kubectl, ns: str, selector: str, count: int, timeout: float = 60
) -> list[str]:
    return wait_until(
        f"{count} Ready pods matching {selector}",
        lambda: names if len(names := ready_names(kubectl, ns, selector)) == count else None,
        timeout=timeout,
    )


def wait_running(
    kubectl: Kubectl, ns: str, selector: str, count: int, timeout: float = 30
) -> list[str]:
    return wait_until(
        f"{count} running pods matching {selector}",
        lambda: names if len(names := running_names(kubectl, ns, selector)) == count else None,
        timeout=timeout,
    )


def get(kubectl: Kubectl, ns: str, kind: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl.json("get", kind, name, "-n", ns)
    return result


def find(kubectl: Kubectl, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    """The object, or None while it does not exist yet (the operator creates it a moment
    after its owner): for probes that wait on an object's status."""
    proc = kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        if "NotFound" in proc.stderr:
            return None
        raise AssertionError(f"kubectl get {kind} {name} failed: {proc.stderr.strip()}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def condition_of(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == kind), None
    )


def wait_condition(
    kubectl: Kubectl, ns: str, kind: str, name: str, kind_: str, reason: str, timeout: float = 30
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = find(kubectl, ns, kind, name) or {}
        for cond in obj.get("status", {}).get("conditions") or []:
            if cond["type"] == kind_ and cond["reason"] == reason:
                return obj
        return None

    return wait_until(
        f"{kind}/{name} condition {kind_} with reason {reason}", probe, timeout=timeout
    )


def two_more_passes(kubectl: Kubectl, operator: OperatorProcess, kind: str) -> None:
    """Until the operator has reconciled each object of `kind` (rljob, policygroup) twice
    more, as far as its counter by kind tells: every object resyncs once a status interval
    (1 s here), so twice as many passes as there are objects of the kind (in all namespaces;
    one, in most tests) hold two of each. What a later pass would do is done by then, so a
    check that nothing happened comes after this, never after a fixed pause."""
    items = kubectl.json("get", PLURALS[kind], "--all-namespaces")["items"]
    objects = sum(1 for item in items if not item["metadata"].get("deletionTimestamp"))
    operator.wait_passes(kind, 2 * max(1, objects))


def events(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def reasons(kubectl: Kubectl, ns: str, name: str) -> list[str]:
    return [e["reason"] for e in events(kubectl, ns, name)]


def fail_pod(kubectl: Kubectl, ns: str, name: str, code: int = 1) -> None:
    """Mark a pod Failed as a kubelet would (status subresource): a failure on demand."""
    status = {"status": {"phase": "Failed", "reason": "Error", "message": f"exit {code}"}}
    kubectl(
        "patch",
        "pod",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )


def finish_pod(kubectl: Kubectl, ns: str, name: str) -> None:
    """Mark a pod Succeeded as a kubelet would once its process exited 0."""
    status = {"status": {"phase": "Succeeded", "reason": "Completed"}}
    kubectl(
        "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip


__all__ = ["condition"]
