"""The operator's only path to the API server: a few verbs, run off the event loop, counted.

The Kubernetes client is synchronous, so each call runs in a worker thread. Every call is
counted (`polyrl_operator_api_requests_total`), which is how the benchmark measures API
requests per reconcile and how a test proves idle jobs cost nothing. 404 on delete and 409
on create are not errors here: reconciling is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from polyrl.api.base import GROUP, VERSION, now_rfc3339
from polyrl.operator import metrics

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"

T = TypeVar("T")


def load_client() -> client.ApiClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config()


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.identity = socket.gethostname()
        self.event_counts: dict[str, int] = {}  # event name -> count posted (aggregation)

    async def _call(self, verb: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        metrics.API_REQUESTS.labels(verb=verb).inc()
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def create_pod(self, body: dict[str, Any]) -> bool:
        """Create; False when it already exists (a restarted operator redoing work)."""
        try:
            await self._call(
                "create", self.core.create_namespaced_pod, body["metadata"]["namespace"], body
            )
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    async def delete_pod(
        self, namespace: str, name: str, uid: str | None = None, grace: int | None = None
    ) -> None:
        body = client.V1DeleteOptions(
            grace_period_seconds=grace,
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            await self._call("delete", self.core.delete_namespaced_pod, name, namespace, body=body)
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    async def patch_pod(
        self, namespace: str, name: str, patch: dict[str, Any] | list[dict[str, Any]]
    ) -> None:
        """A strategic merge patch (a dict) or a JSON patch (a list of operations)."""
        await self._call("patch", self.core.patch_namespaced_pod, name, namespace, patch)

    async def ensure_service(self, body: dict[str, Any]) -> None:
        try:
            await self._call(
                "create", self.core.create_namespaced_service, body["metadata"]["namespace"], body
            )
        except ApiException as err:
            if err.status != 409:
                raise

    async def ensure_claim(self, body: dict[str, Any]) -> bool:
        """Create a PersistentVolumeClaim; False when it exists already (left as it is)."""
        namespace = body["metadata"]["namespace"]
        try:
            await self._call(
                "create", self.core.create_namespaced_persistent_volume_claim, namespace, body
            )
        except ApiException as err:
            if err.status != 409:
                raise
            return False
        return True

    async def create_custom(self, plural: str, body: dict[str, Any]) -> bool:
        try:
            await self._call(
                "create",
                self.custom.create_namespaced_custom_object,
                GROUP,
                VERSION,
                body["metadata"]["namespace"],
                plural,
                body,
            )
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    async def patch_custom(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> None:
        await self._call(
            "patch",
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            patch,
        )

    async def read_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Kueue Workload, or None where there is none (not made yet, or no Kueue)."""
        try:
            found: dict[str, Any] = await self._call(
                "get",
                self.custom.get_namespaced_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                namespace,
                "workloads",
                name,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        try:
            await self._call(
                "patch",
                self.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                {"status": status},
            )
        except ApiException as err:
            if err.status != 404:  # deleted meanwhile
                raise

    async def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        secret = await self._call("get", self.core.read_namespaced_secret, name, namespace)
        return dict(secret.data or {})

    async def find_secret(
        self, namespace: str, name: str
    ) -> tuple[dict[str, str], dict[str, str]] | None:
        """The Secret's annotations and data (base64 values), or None where there is none."""
        try:
            secret = await self._call("get", self.core.read_namespaced_secret, name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return dict(secret.metadata.annotations or {}), dict(secret.data or {})

    async def create_secret(self, body: dict[str, Any]) -> None:
        namespace = body["metadata"]["namespace"]
        await self._call("create", self.core.create_namespaced_secret, namespace, body)

    async def add_to_secret(
        self,
        namespace: str,
        name: str,
        data: dict[str, str],
        *,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Merge `data` (base64 values) into the Secret's keys, and `annotations` into its."""
        body: dict[str, Any] = {"data": data}
        if annotations:
            body["metadata"] = {"annotations": annotations}
        await self._call("patch", self.core.patch_namespaced_secret, name, namespace, body)

    async def event(self, obj: dict[str, Any], *, type: str, reason: str, message: str) -> None:
        """A core/v1 Event on `obj` (what `kubectl describe` lists). The same event again
        (same object, type, reason and message: a pod failing the same way) raises the
        first one's count instead of adding another, as the kubelet's recorder does."""
        meta = obj["metadata"]
        now = now_rfc3339()
        key = f"{meta.get('uid')}/{type}/{reason}/{message}"
        name = f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        seen = self.event_counts.get(name)
        if seen is not None:
            self.event_counts[name] = seen + 1
            patch = {"count": seen + 1, "lastTimestamp": now}
            with contextlib.suppress(ApiException):
                await self._call(
                    "patch", self.core.patch_namespaced_event, name, meta["namespace"], patch
                )
                return
        body = {
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "polyrl-operator"},
            "reportingComponent": "polyrl-operator",
            "reportingInstance": self.identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if len(self.event_counts) > 10_000:  # a long-lived operator forgets old ones
            self.event_counts.clear()
        self.event_counts[name] = 1
        with contextlib.suppress(ApiException):  # best effort; never fail a reconcile over it
            await self._call("create", self.core.create_namespaced_event, meta["namespace"], body)
