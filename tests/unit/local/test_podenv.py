"""The node agent resolves env, commands and field references as the kubelet does."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from polyrl.local import podenv

POD: dict[str, Any] = {
    "metadata": {
        "name": "p1",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"app": "solver"},
        "annotations": {"a/b": "c"},
    },
    "spec": {
        "nodeName": "n0",
        "serviceAccountName": "default",
        "containers": [{"name": "main", "resources": {"limits": {"cpu": "2"}}}],
    },
    "status": {"podIP": "127.0.0.1"},
}


def lookup(kind: str, namespace: str, name: str) -> dict[str, str] | None:
    store = {
        ("secret", "ns", "creds"): {"token": base64.b64encode(b"s3cret").decode()},
        ("configmap", "ns", "cfg"): {"LEVEL": "debug", "MODE": "fast"},
    }
    return store.get((kind, namespace, name))


def test_expansion_replaces_known_names_and_keeps_unknown_ones() -> None:
    env = {"A": "1", "B": "two"}
    assert podenv.expand("$(A)-$(B)-$(C)-$$(A)", env) == "1-two-$(C)-$(A)"


def test_field_refs_cover_metadata_spec_status_and_label_subscripts() -> None:
    assert podenv.field_value(POD, "metadata.name") == "p1"
    assert podenv.field_value(POD, "metadata.uid") == "u-1"
    assert podenv.field_value(POD, "spec.nodeName") == "n0"
    assert podenv.field_value(POD, "metadata.labels['app']") == "solver"
    assert podenv.field_value(POD, "metadata.annotations['a/b']") == "c"
    with pytest.raises(podenv.EnvError, match="unsupported fieldRef"):
        podenv.field_value(POD, "spec.nothing")


def test_container_env_resolves_every_source_in_order() -> None:
    container = {
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "URL", "value": "nats://$(POD):4222"},
        ],
    }
    env = podenv.container_env(POD, container, lookup)
    assert env == {
        "CFG_LEVEL": "debug",
        "CFG_MODE": "fast",
        "POD": "p1",
        "TOKEN": "s3cret",
        "CPU": "2",
        "URL": "nats://p1:4222",
    }


def test_a_missing_secret_key_is_an_error_unless_optional() -> None:
    ref = {"name": "creds", "key": "nope"}
    container = {"name": "main", "env": [{"name": "X", "valueFrom": {"secretKeyRef": ref}}]}
    with pytest.raises(podenv.EnvError, match="has no key 'nope'"):
        podenv.container_env(POD, container, lookup)
    ref["optional"] = True  # type: ignore[assignment]
    assert podenv.container_env(POD, container, lookup) == {}


def test_argv_joins_command_and_args_with_expansion() -> None:
    container = {"name": "main", "command": ["python", "-m", "x"], "args": ["--pod=$(POD)"]}
    assert podenv.container_argv(container, {"POD": "p1"}) == ["python", "-m", "x", "--pod=p1"]


def test_a_container_without_command_is_refused_with_a_reason() -> None:
    with pytest.raises(podenv.EnvError, match="runs commands, not images"):
        podenv.container_argv({"name": "main", "image": "nginx"}, {})
