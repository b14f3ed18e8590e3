"""Test support: a dynamic provisioner that binds PersistentVolumeClaims to host directories.

The test cluster has no storage driver, so the node agent runs this small one beside its
kubelet loops. It installs the StorageClass `polyrl-host-path` (the cluster's default,
`volumeBindingMode: Immediate`, `reclaimPolicy: Delete`) and, for every claim of that
class, creates a PersistentVolume `pvc-<claim uid>` whose `hostPath` is a fresh directory
under its root, pre-bound to the claim (kube-controller-manager's binder completes the
binding). A released volume of ours is removed with its directory when its reclaim policy
is Delete and left as it is under Retain, as an external provisioner does. Every node of the
test cluster is the same host, so a pod that mounts the claim on any node, or a
replacement pod, sees the same files.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("polyrl.provisioner")

PROVISIONER = "polyrl.dev/host-path"
STORAGE_CLASS = "polyrl-host-path"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_for(claim: dict[str, Any], root: Path, reclaim: str) -> dict[str, Any]:
    """The PersistentVolume that satisfies `claim`: its size and access modes, pre-bound."""
    meta, spec = claim["metadata"], claim["spec"]
    name = f"pvc-{meta['uid']}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "persistentVolumeReclaimPolicy": reclaim,
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(root / name), "type": "Directory"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


class Provisioner:
    def __init__(self, api: client.ApiClient, root: Path, *, resync: float = 30.0) -> None:
        self.core = client.CoreV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.root = root
        self.resync = resync
        self.stop = threading.Event()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.storage.create_storage_class(storage_class())
        except ApiException as err:
            if err.status != 409:
                raise
        for name, lister, handle in (
            ("claims", self.core.list_persistent_volume_claim_for_all_namespaces, self.claim),
            ("volumes", self.core.list_persistent_volume, self.volume),
        ):
            threading.Thread(
                target=self._loop, args=(lister, handle), name=f"provision-{name}", daemon=True
            ).start()

    def _loop(self, lister: Callable[..., Any], handle: Callable[[dict[str, Any]], None]) -> None:
        while not self.stop.is_set():
            try:
                listing = json.loads(lister(_preload_content=False).data)
                for item in listing["items"]:
                    self._handle(handle, item)
                stream = watch.Watch().stream(
                    lister,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=int(self.resync),
                )
                for event in stream:
                    if self.stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._handle(handle, event["raw_object"])
            except (ApiException, OSError) as err:  # the API server may restart
                log.warning("provisioner watch failed, retrying: %s", err)
                self.stop.wait(1.0)

    def _handle(self, handle: Callable[[dict[str, Any]], None], obj: dict[str, Any]) -> None:
        try:
            handle(obj)
        except ApiException:
            raise
        except Exception:  # one odd object must not stop provisioning for the others
            log.exception("provisioner: handling %s failed", obj["metadata"].get("name"))

    def claim(self, pvc: dict[str, Any]) -> None:
        """Create a volume for an unbound claim of our class."""
        spec = pvc["spec"]
        if spec.get("volumeName") or spec.get("storageClassName") != STORAGE_CLASS:
            return
        reclaim = self.storage.read_storage_class(STORAGE_CLASS).reclaim_policy or "Delete"
        body = volume_for(pvc, self.root, reclaim)
        path = Path(body["spec"]["hostPath"]["path"])
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)  # any pod user may write, as on a fresh file system
        try:
            self.core.create_persistent_volume(body)
        except ApiException as err:
            if err.status != 409:
                raise
            return
        meta = pvc["metadata"]
        log.info(
            "provisioned %s for claim %s/%s",
            body["metadata"]["name"],
            meta["namespace"],
            meta["name"],
        )

    def volume(self, pv: dict[str, Any]) -> None:
        """Remove a released volume of ours whose reclaim policy is Delete."""
        meta, spec = pv["metadata"], pv["spec"]
        if (meta.get("annotations") or {}).get(PROVISIONED_BY) != PROVISIONER:
            return
        if pv.get("status", {}).get("phase") != "Released":
            return
        if spec.get("persistentVolumeReclaimPolicy") != "Delete":
            return
        shutil.rmtree(spec["hostPath"]["path"], ignore_errors=True)
        try:
            self.core.delete_persistent_volume(meta["name"])
        except ApiException as err:
            if err.status != 404:
                raise
        log.info("deleted released volume %s and its directory", meta["name"])
