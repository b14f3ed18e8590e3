"""Generated manifests against the real API server with the operator running: each RLJob or
PolicyGroup is rejected with a message that names a field, or accepted and reconciled to a
phase with conditions; the operator logs no traceback and keeps running.

The manifests are mutants of two valid RLJobs (one with a dataset task, whose params the
CRD's CEL rules check) and a valid PolicyGroup (hypothesis, derandomised): one node anywhere
in the document replaced by a value of another type or an out-of-range number, removed, or
given an unknown sibling. `POLYRL_FUZZ_SCALE` multiplies
their number (`make test-fuzz`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests import fuzzing

from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until

from .helpers import job_doc, two_more_passes

pytestmark = pytest.mark.slow
GROUP, VERSION = "polyrl.dev", "v1alpha1"
# A field's path; or, where the API server cannot decode `metadata` at all (a string in its
# place), the Go type it names for it.
FIELD_NAMED = re.compile(r"\b(spec|metadata|apiVersion|kind)[.\[: ]|\bv1\.ObjectMeta\b")


def policy_group() -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PolicyGroup",
        "metadata": {"name": "pg"},
        "spec": {
            "jobRef": "absent",
            "policy": "solver",
            "rollout": {"replicas": 1, "maxReplicas": 4},
            "trainer": {"replicas": 1},
        },
    }


def dataset_job() -> dict[str, Any]:
    """A job whose task's params the CRD's CEL rules check (polyrl.api.taskparams)."""
    params = {"path": "/data/train.parquet", "format": "verl", "heldOutFraction": 0.1}
    return job_doc("fz", workflow={"task": {"name": "dataset", "params": params}})


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every node's path below the top, except apiVersion and kind (kubectl's, not ours)."""
    found = []
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    )
    for key, value in items:
        if prefix == () and key in ("apiVersion", "kind"):
            continue
        found.append((*prefix, key))
        found += paths(value, (*prefix, key))
    return found


def mutate(doc: dict[str, Any], path: tuple[Any, ...], how: str, value: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    node: Any = copy
    for key in path[:-1]:
        node = node[key]
    if how == "remove":
        del node[path[-1]]
    elif how == "extra" and isinstance(node, dict):
        node["unknownField"] = value
    else:
        node[path[-1]] = value
    return copy


def manifests(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    values = st.one_of(
        fuzzing.WRONG_VALUES,
        st.sampled_from([-1, 0, 10**6, 2**40, "", "Not_A_Name", "x" * 300, 1e300]),
    )
    return st.tuples(
        st.sampled_from(paths(valid)), st.sampled_from(["replace", "remove", "extra"]), values
    ).map(lambda m: json.dumps(mutate(valid, *m)).encode())


def create(api: client.CustomObjectsApi, ns: str, doc: dict[str, Any]) -> str | None:
    """None if accepted, else the API server's message."""
    plural = "rljobs" if doc.get("kind") == "RLJob" else "policygroups"
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, ns, plural, doc)
    except ApiException as err:
        return str(json.loads(err.body or "{}").get("message", err.body))
    return None


def test_generated_manifests_are_rejected_naming_a_field_or_reconciled_with_conditions(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, kube_api: client.ApiClient
) -> None:
    docs = [job_doc("fz"), dataset_job(), policy_group()]
    drawn = [
        json.loads(m)
        for valid, count in zip(docs, (45, 15, 15), strict=True)
        for m in fuzzing.examples(manifests(valid), count)
    ]
    api = client.CustomObjectsApi(kube_api)
    accepted: list[tuple[str, str]] = []
    pid = operator.proc.popen.pid if operator.proc and operator.proc.popen else None
    log_start = len(operator.log())
    for i, doc in enumerate(drawn):
        if isinstance(doc.get("metadata"), dict) and "name" in doc["metadata"]:
            doc["metadata"]["name"] = f"fz-{i}"  # unique, unless the mutant broke the name
        said = create(api, namespace, doc)
        if said is None:
            accepted.append((doc["kind"], doc["metadata"]["name"]))
        else:
            assert FIELD_NAMED.search(said), (doc, said)
    print(
        f"{len(drawn)} manifests: {len(drawn) - len(accepted)} rejected, {len(accepted)} accepted"
    )
    assert len(drawn) >= 75
    assert len(accepted) < len(drawn)

    def reconciled() -> list[str]:
        waiting = []
        for kind, name in accepted:
            plural = "rljobs" if kind == "RLJob" else "policygroups"
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
            status = obj.get("status") or {}
            if not status.get("phase") or not status.get("conditions"):
                waiting.append(f"{kind}/{name}")
        return waiting

    wait_until("every accepted manifest reconciled", lambda: not reconciled(), timeout=120)
    for kind in ("rljob", "policygroup"):  # a late handler failure would have logged by then
        two_more_passes(kubectl, operator, kind)
    assert "Traceback" not in operator.log()[log_start:]
    assert operator.proc is not None
    assert operator.proc.alive()
    assert operator.proc.popen is not None
    assert operator.proc.popen.pid == pid  # never restarted
