"""CustomResourceDefinitions generated from the pydantic models (`polyrl crds` writes crds/).

Pydantic emits JSON Schema 2020-12; the API server wants a *structural* OpenAPI v3 schema.
The conversion inlines `$ref`s, turns `Optional[X]` into X (absence means unset), maps
`exclusiveMinimum: n` to `minimum: n, exclusiveMinimum: true`, gives nested objects with
defaults `default: {}` so the API server fills their defaults too, and keeps descriptions,
bounds, enums, patterns and every `x-kubernetes-*` extension (CEL rules, list types). What
no schema can say (an RLJob that exists, one trainer per policy) the operator checks and
reports as conditions.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from polyrl.api import base
from polyrl.api.resources import (
    LONGEST_SUFFIX,
    MAX_NAME,
    PolicyGroupSpec,
    PolicyGroupStatus,
    RLJobSpec,
    RLJobStatus,
)

_KEEP = {
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "format",
    "required",
}
_SCALARS = {"integer", "number", "string", "boolean"}
# Helm never upgrades CRDs, and the API server silently drops fields an older schema lacks,
# so each CRD says which schema it is; the operator refuses to run against another.
SCHEMA_HASH = f"{base.GROUP}/schema-hash"


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[1]]
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **extra}
    return node


def convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON-Schema node to a structural OpenAPI v3 node."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        return _convert_any_of(node, defs)
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    out: dict[str, Any] = {
        k: v for k, v in node.items() if k in _KEEP or k.startswith("x-kubernetes-")
    }
    if "exclusiveMinimum" in node:
        out["minimum"], out["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node:
        out["maximum"], out["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if out.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        _convert_object(node, out, defs)
    if "items" in node:
        out["items"] = convert(node["items"], defs)
    if out.get("default") is None:
        out.pop("default", None)
    return out


def _convert_object(node: dict[str, Any], out: dict[str, Any], defs: dict[str, Any]) -> None:
    props = node.get("properties", {})
    if props:
        out["properties"] = {}
        for name, sub in props.items():
            converted = convert(sub, defs)
            nested_model = "$ref" in sub and _resolve(sub, defs).get("type") == "object"
            if nested_model and name not in node.get("required", []) and "default" not in sub:
                converted["default"] = _model_default(sub["$ref"].rsplit("/", 1)[1])
            out["properties"][name] = converted
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = convert(extra, defs)
    if not out.get("required"):
        out.pop("required", None)


def _models() -> dict[str, type[base.ApiModel]]:
    found: dict[str, type[base.ApiModel]] = {}
    todo: list[type[base.ApiModel]] = [base.ApiModel]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def _model_default(name: str) -> dict[str, Any]:
    """The full default of a nested model: the API server checks a default against the CEL
    rules as it stands, without filling the nested defaults first."""
    return _models()[name]().to_api()


def _convert_any_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    options = [o for o in node["anyOf"] if o != {"type": "null"}]
    meta = {k: v for k, v in node.items() if k != "anyOf"}
    if len(options) == 1:
        return convert({**_resolve(options[0], defs), **meta}, defs)
    if node.get("x-kubernetes-int-or-string"):
        out = {k: v for k, v in meta.items() if k in _KEEP or k.startswith("x-kubernetes-")}
        return {**out, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    if all(_resolve(o, defs).get("type") in _SCALARS for o in options):
        # A scalar of several types (task parameters): kept as given, checked by the task.
        out = {k: v for k, v in meta.items() if k in ("description",)}
        return {**out, "x-kubernetes-preserve-unknown-fields": True}
    raise ValueError(f"cannot express {node} structurally")


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return convert(raw, defs)


_NAME_RULE = {
    "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    "message": "metadata.name must be a DNS-1035 label: lower-case letters, digits and '-', "
    "starting with a letter",
}


def _root(
    spec: type[BaseModel], status: type[BaseModel], rules: list[dict[str, str]]
) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": schema_of(spec),
            "status": schema_of(status),
        },
        "x-kubernetes-validations": [_NAME_RULE, *rules],
    }


def _crd(
    kind: str,
    plural: str,
    short: str,
    schema: dict[str, Any],
    columns: list[dict[str, Any]],
    subresources: dict[str, Any],
) -> dict[str, Any]:
    spec = {
        "group": base.GROUP,
        "scope": "Namespaced",
        "names": {
            "kind": kind,
            "plural": plural,
            "singular": kind.lower(),
            "shortNames": [short],
            "categories": ["polyrl"],
        },
        "versions": [
            {
                "name": base.VERSION,
                "served": True,
                "storage": True,
                "subresources": subresources,
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": schema},
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{base.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "polyrl"},
            "annotations": {SCHEMA_HASH: spec_hash(spec)},
        },
        "spec": spec,
    }


def spec_hash(spec: dict[str, Any]) -> str:
    """A short digest of a CRD's spec (its schemas, columns and names)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def schema_hashes() -> dict[str, str]:
    """CRD name -> the schema hash this code expects (polyrl's own CRDs)."""
    return {
        doc["metadata"]["name"]: doc["metadata"]["annotations"][SCHEMA_HASH]
        for doc in (rljob_crd(), policygroup_crd())
    }


def _col(
    name: str, path: str, type_: str = "string", description: str = "", *, wide: bool = False
) -> dict[str, Any]:
    col: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if description:
        col["description"] = description
    if wide:  # shown by `kubectl get -o wide` only
        col["priority"] = 1
    return col


def rljob_crd() -> dict[str, Any]:
    names_fit = {
        "rule": f"self.spec.policies.all(p, size(self.metadata.name) + 1 + size(p.name) + "
        f"{LONGEST_SUFFIX} <= {MAX_NAME})",
        "message": f"job and policy names are too long: '<job>-<policy>' plus the "
        f"{LONGEST_SUFFIX}-character pod suffix must fit in {MAX_NAME} characters",
    }
    schema = _root(RLJobSpec, RLJobStatus, [names_fit])
    columns = [
        _col("Phase", ".status.phase"),
        _col("Policies", ".status.policiesReady", description="Policies ready / total"),
        _col("Step", ".status.step", "integer", "Smallest trainer step over the policies"),
        _col("Progress", ".status.progress", description="The least advanced policy's steps"),
        _col("ETA", ".status.eta", description="Longest time left over the policies"),
        _col("Version", ".status.weightVersion", "integer", "Smallest weight version"),
        _col("Rollouts", ".status.rollouts", description="Ready / desired rollout pods"),
        _col("Age", ".metadata.creationTimestamp", "date"),
    ]
    return _crd("RLJob", "rljobs", "rlj", schema, columns, {"status": {}})


def policygroup_crd() -> dict[str, Any]:
    names_fit = {
        "rule": f"size(self.metadata.name) + {LONGEST_SUFFIX} <= {MAX_NAME}",
        "message": f"metadata.name is too long: plus the {LONGEST_SUFFIX}-character pod "
        f"suffix it must fit in {MAX_NAME} characters",
    }
    schema = _root(PolicyGroupSpec, PolicyGroupStatus, [names_fit])
    columns = [
        _col("Job", ".spec.jobRef"),
        _col("Policy", ".spec.policy"),
        _col("Phase", ".status.phase"),
        _col("Ready", ".status.readyReplicas", "integer", "Ready rollout pods"),
        _col("Desired", ".spec.rollout.replicas", "integer", "Desired rollout pods"),
        _col("Served-By", ".status.servedBy", description="The policy whose pool serves it"),
        _col("Version", ".status.weightVersion", "integer", "Weight version served"),
        _col("Step", ".status.step", "integer", "Trainer step (a group with the trainer)"),
        _col("Progress", ".status.progress", description="Trainer steps done of the budget"),
        _col("ETA", ".status.eta", description="Time left at the trainer's recent pace"),
        _col("Held-out", ".status.heldOut", "number", "The trainer's last held-out figure"),
        _col("Tok/s", ".status.tokensPerSecond", "number", "Rollout throughput", wide=True),
        _col("Queue", ".status.queueDepth", "integer", "Requests waiting", wide=True),
        _col("Stale-p95", ".status.stalenessP95", "number", "Sample age p95", wide=True),
        _col("IS-dev", ".status.isDeviation", "number", "Mean |w-1| of the last step", wide=True),
        _col("Clip-%", ".status.clipPercent", "number", "Tokens clipped or masked", wide=True),
        _col("Sync-s", ".status.syncSeconds", "number", "Last weight sync", wide=True),
        _col("Changed-%", ".status.changedPercent", "number", "Last delta", wide=True),
        _col("Age", ".metadata.creationTimestamp", "date"),
    ]
    scale = {
        "specReplicasPath": ".spec.rollout.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    return _crd(
        "PolicyGroup", "policygroups", "pg", schema, columns, {"status": {}, "scale": scale}
    )


def all_crds() -> dict[str, dict[str, Any]]:
    """File name in crds/ -> CRD document."""
    return {
        "polyrl.dev_rljobs.yaml": rljob_crd(),
        "polyrl.dev_policygroups.yaml": policygroup_crd(),
        **kopf_peering_crds(),
    }


def kopf_peering_crds() -> dict[str, dict[str, Any]]:
    """kopf's peering resources, so a second operator replica pauses instead of fighting."""

    def crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kopf.dev"},
            "spec": {
                "scope": scope,
                "group": "kopf.dev",
                "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "status": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    }
                                },
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }

    return {
        "kopf.dev_clusterkopfpeerings.yaml": crd(
            "ClusterKopfPeering", "clusterkopfpeerings", "Cluster"
        )
    }
