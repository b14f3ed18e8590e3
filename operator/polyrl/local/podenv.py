"""Resolving a container's environment and command the way the kubelet does.

Pure functions over plain dicts (pods as the API returns them, camelCase), so they are
unit-tested without a cluster; secrets and config maps are looked up through a callback.
`polyrl run` expands launches' commands with `expand`, as the kubelet would in a pod; the
test node agent renders whole pods with the rest.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

# (kind, namespace, name) -> the object's `data` (secrets still base64-encoded), or None.
Lookup = Callable[[str, str, str], Mapping[str, str] | None]

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class EnvError(ValueError):
    """A reference the pod makes cannot be resolved (missing key, secret, field)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: unknown names stay as written, `$$` escapes."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR.sub(sub, text)


def field_value(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP") or "127.0.0.1",
        "status.hostIP": status.get("hostIP") or "127.0.0.1",
    }
    if path in simple:
        return str(simple[path] or "")
    if path in ("metadata.labels", "metadata.annotations"):  # downward API volumes only
        items = sorted((meta.get(path.split(".")[1]) or {}).items())
        return "\n".join(f"{k}={json.dumps(v)}" for k, v in items)
    match = _SUBSCRIPT.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise EnvError(f"unsupported fieldRef {path!r}")


def _ref_value(kind: str, ref: Mapping[str, Any], namespace: str, lookup: Lookup) -> str | None:
    data = lookup(kind, namespace, ref["name"])
    optional = bool(ref.get("optional", False))
    if data is None or ref["key"] not in data:
        if optional:
            return None
        raise EnvError(f"{kind} {namespace}/{ref['name']} has no key {ref['key']!r}")
    raw = data[ref["key"]]
    return base64.b64decode(raw).decode() if kind == "secret" else raw


def _from_source(item: Mapping[str, Any], pod: Mapping[str, Any], lookup: Lookup) -> str | None:
    source, namespace = item["valueFrom"], pod["metadata"]["namespace"]
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    if "secretKeyRef" in source:
        return _ref_value("secret", source["secretKeyRef"], namespace, lookup)
    if "configMapKeyRef" in source:
        return _ref_value("configmap", source["configMapKeyRef"], namespace, lookup)
    if "resourceFieldRef" in source:
        return resource_field(pod, source["resourceFieldRef"])
    raise EnvError(f"unsupported valueFrom in env {item['name']!r}")


def resource_field(pod: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    section, _, resource = ref["resource"].partition(".")
    for container in pod["spec"]["containers"]:
        if ref.get("containerName") in (None, container["name"]):
            value = (container.get("resources") or {}).get(section, {}).get(resource)
            if value is not None:
                return str(value)
    return "0"


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], lookup: Lookup
) -> dict[str, str]:
    """The env a container sees: envFrom first, then env in order, each expanded."""
    env: dict[str, str] = {}
    namespace = pod["metadata"]["namespace"]
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if key in source:
                data = lookup(kind, namespace, source[key]["name"])
                if data is None and not source[key].get("optional", False):
                    raise EnvError(f"{kind} {namespace}/{source[key]['name']} not found")
                for k, v in (data or {}).items():
                    env[prefix + k] = base64.b64decode(v).decode() if kind == "secret" else v
    for item in container.get("env") or []:
        if "valueFrom" in item:
            value = _from_source(item, pod, lookup)
            if value is not None:
                env[item["name"]] = value
        else:
            env[item["name"]] = expand(item.get("value", ""), env)
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expanded; without `command` the image would decide,
    and there is no image here, so that is an error the pod's status reports."""
    command = container.get("command") or []
    if not command:
        raise EnvError(
            f"container {container['name']!r} has no command; the node agent runs commands, "
            "not images"
        )
    return [expand(part, env) for part in [*command, *(container.get("args") or [])]]
