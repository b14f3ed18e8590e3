"""Refusing to run against CRDs of another schema.

Helm installs CRDs once and never upgrades them, and the API server silently prunes fields
an installed CRD does not know: an operator newer than its CRDs would see, say, every
`trainer.checkpoint` vanish from the jobs it reconciles. Each generated CRD carries the
hash of its schema (`polyrl.dev/schema-hash`); at start the operator compares the installed
CRDs' hashes with its own and, on any difference, logs what to apply, posts a Warning
Event on the CRD and exits instead of reconciling.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from polyrl.api import crds
from polyrl.api.base import now_rfc3339

log = logging.getLogger("polyrl.operator.crds")
FIX = "apply the CRDs of this polyrl version: kubectl apply --server-side -f crds/"


@dataclass(frozen=True, slots=True)
class Mismatch:
    crd: str
    found: str | None  # None: not installed, or installed without a hash
    expected: str
    uid: str | None = None

    def message(self) -> str:
        if self.uid is None:
            return f"CRD {self.crd} is not installed; {FIX}"
        found = self.found or "none (an older polyrl)"
        return (
            f"CRD {self.crd} has schema {found}, this operator needs {self.expected}: the "
            f"API server would drop fields this operator sets; {FIX}"
        )


def mismatches(api: client.ApiClient) -> list[Mismatch]:
    """polyrl's CRDs whose installed schema is not this code's."""
    ext = client.ApiextensionsV1Api(api)
    found = []
    for name, expected in crds.schema_hashes().items():
        items = ext.list_custom_resource_definition(field_selector=f"metadata.name={name}").items
        if not items:
            found.append(Mismatch(name, None, expected))
            continue
        meta = items[0].metadata
        have = (meta.annotations or {}).get(crds.SCHEMA_HASH)
        if have != expected:
            found.append(Mismatch(name, have, expected, meta.uid))
    return found


def report(api: client.ApiClient, problems: list[Mismatch]) -> None:
    """Log each mismatch and post it as a Warning Event on the CRD (in `default`, where
    events about cluster-scoped objects live)."""
    core = client.CoreV1Api(api)
    for problem in problems:
        log.error("refusing to start: %s", problem.message())
        if problem.uid is None:
            continue
        try:
            core.create_namespaced_event("default", _event(problem))
        except ApiException as err:
            log.warning("could not post the event: %s", err.reason)


def _event(problem: Mismatch) -> dict[str, Any]:
    now = now_rfc3339()
    return {
        "metadata": {"generateName": f"{problem.crd}.", "namespace": "default"},
        "involvedObject": {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "name": problem.crd,
            "uid": problem.uid,
        },
        "type": "Warning",
        "reason": "SchemaMismatch",
        "message": problem.message(),
        "source": {"component": "polyrl-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
