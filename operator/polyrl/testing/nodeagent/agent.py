"""The agent's loops: node heartbeats, and a list-then-watch loop over pods.

Reconciling is level-based: every list and every watch event is handed to `reconcile(pod)`,
which compares the pod with what the agent runs and acts, so a missed event is repaired
by the next list (every `resync` seconds). Beside them run the kubelet API (container
logs) and the test provisioner of PersistentVolumes.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from polyrl.testing import pki, provisioner
from polyrl.testing.nodeagent import kubeletapi, nodes, podnet, podstatus, volumes
from polyrl.testing.nodeagent.runner import NodeContext, PodRunner

log = logging.getLogger("polyrl.nodeagent")

MODE_LABEL = "agent.polyrl.dev/mode"
MODES = ("exec", "status")


class Agent:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        nodes_: list[nodes.NodeSpec],
        mode: str,
        workdir: Path,
        kube_version: str = "v1.36.3",
        lease_interval: float = 10.0,
        status_interval: float = 60.0,
        resync: float = 30.0,
        keep: tuple[str, ...] = (),
        token_max_age: float = 24 * 3600.0,
        volume_sync: float = 10.0,
        pass_env: Mapping[str, str] | None = None,
        images: Mapping[str, str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.nodes = {n.name: n for n in nodes_}
        self.network = podnet.PodNetwork.claim()
        self.network.record(workdir / podnet.RECORD)
        self.addresses = {
            n.name: podnet.Addresses(self.network.node_cidr(i)) for i, n in enumerate(nodes_)
        }
        self.mode = mode
        self.workdir = workdir
        self.kube_version = kube_version
        self.lease_interval = lease_interval
        self.status_interval = status_interval
        self.resync = resync
        self.runners: dict[str, PodRunner] = {}  # by pod uid
        self.pod_ips: dict[str, tuple[str, str]] = {}  # pod uid -> (node, address)
        self.marked: set[str] = set()  # status-mode pods already reported Running
        self.terminating: set[str] = set()  # pods whose graceful deletion is under way
        self.stop = threading.Event()
        self._ns_modes: dict[str, tuple[float, str]] = {}
        server = urllib.parse.urlsplit(api.configuration.host)
        source = ApiSource(self.core)
        self.context = NodeContext(
            source=source,
            lookup=source.lookup,
            api_host=server.hostname or "127.0.0.1",
            api_port=server.port or 443,
            shim=podnet.build_shim(),
            keep=keep,
            token_max_age=token_max_age,
            volume_sync=volume_sync,
            pass_env=dict(pass_env or {}),
            images=dict(images or {}),
        )
        serving = pki.self_signed(workdir / "pki", "kubelet", "polyrl-node-agent")
        self.kubelet_api = kubeletapi.KubeletApi(self._find, cert=serving.cert, key=serving.key)
        self.provisioner = provisioner.Provisioner(api, workdir / "persistent-volumes")

    def run(self) -> None:
        self.kubelet_api.start()
        self.provisioner.start()
        for index, spec in enumerate(self.nodes.values()):
            nodes.register(
                self.core,
                spec,
                self.kube_version,
                kubelet_port=self.kubelet_api.port,
                pod_cidr=str(self.network.node_cidr(index)),
            )
            nodes.renew_lease(self.coord, spec.name)
        log.info(
            "registered nodes %s (mode %s; pod IPs from %s; kubelet API on 127.0.0.1:%d; "
            "bind shim %s)",
            ", ".join(self.nodes),
            self.mode,
            self.network.cidr or "127.0.0.0/8",
            self.kubelet_api.port,
            self.context.shim or "missing",
        )
        beat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        beat.start()
        try:
            while not self.stop.is_set():
                try:
                    self._list_and_watch()
                except (ApiException, OSError) as err:  # the API server may restart
                    log.warning("pod watch failed, retrying: %s", err)
                    self.stop.wait(1.0)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        self.stop.set()
        self.provisioner.stop.set()
        for runner in list(self.runners.values()):
            runner.terminate(grace=5)
            runner.remove()
        self.kubelet_api.stop()
        self.network.release()

    def _heartbeat(self) -> None:
        last_status = time.monotonic()
        while not self.stop.wait(self.lease_interval):
            refresh = time.monotonic() - last_status >= self.status_interval
            for name in self.nodes:
                try:
                    nodes.renew_lease(self.coord, name)
                    if refresh:
                        nodes.refresh_ready(self.core, name)
                except (ApiException, OSError) as err:
                    log.warning("heartbeat for node %s failed: %s", name, err)
            if refresh:
                last_status = time.monotonic()

    def _list_and_watch(self) -> None:
        resp = self.core.list_pod_for_all_namespaces(_preload_content=False)
        listing = json.loads(resp.data)
        for pod in listing["items"]:
            self.reconcile(pod)
        stream = watch.Watch().stream(
            self.core.list_pod_for_all_namespaces,
            resource_version=listing["metadata"]["resourceVersion"],
            timeout_seconds=int(self.resync),
            allow_watch_bookmarks=True,
        )
        for event in stream:
            if self.stop.is_set():
                return
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                self.reconcile(event["raw_object"], deleted=event["type"] == "DELETED")

    def mode_for(self, namespace: str) -> str:
        cached = self._ns_modes.get(namespace)
        if cached and time.monotonic() - cached[0] < 5.0:
            return cached[1]
        try:
            labels = self.core.read_namespace(namespace).metadata.labels or {}
        except ApiException:
            labels = {}
        mode = labels.get(MODE_LABEL, self.mode)
        self._ns_modes[namespace] = (time.monotonic(), mode if mode in MODES else self.mode)
        return self._ns_modes[namespace][1]

    def reconcile(self, pod: dict[str, Any], *, deleted: bool = False) -> None:
        if pod["spec"].get("nodeName") not in self.nodes:
            return
        uid = pod["metadata"]["uid"]
        if deleted:
            self._forget(uid)
            return
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate(pod)
            return
        phase = pod.get("status", {}).get("phase", "Pending")
        if phase in ("Succeeded", "Failed") or uid in self.runners or uid in self.marked:
            return
        if self.mode_for(pod["metadata"]["namespace"]) == "status":
            self._mark_running(pod)
        elif phase == "Running":
            self._patch(
                pod,
                podstatus.pod_status(
                    "Failed",
                    podstatus.containers_of(pod),
                    start_time=podstatus.stamp(),
                    reason="NodeAgentLost",
                    message="the node agent restarted; processes are gone",
                ),
            )
        else:
            self._start(pod)

    def _address(self, pod: dict[str, Any]) -> str:
        """The pod's IP: its own loopback address, or the host's under hostNetwork."""
        if pod["spec"].get("hostNetwork"):
            return podnet.HOST_IP
        node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
        if uid not in self.pod_ips:
            self.pod_ips[uid] = (node, self.addresses[node].take())
        return self.pod_ips[uid][1]

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        sandbox = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        runner = PodRunner(
            pod,
            sandbox=sandbox,
            node=self.context,
            pod_ip=self._address(pod),
            patch_status=lambda status: self._patch(pod, status),
        )
        self.runners[meta["uid"]] = runner
        if not pod["spec"].get("hostNetwork"):
            self.network.attach(runner.pod_ip)
        log.info("pod %s: starting in %s at %s", runner.key, sandbox, runner.pod_ip)
        self._refresh_hosts(runner.subdomain)
        runner.start()

    def _refresh_hosts(self, subdomain: tuple[str, str] | None) -> None:
        """Every running pod of `subdomain` names the others in its /etc/hosts, as a headless
        Service's DNS records would (the test cluster has no DNS)."""
        if subdomain is None:
            return
        pods = [
            r for r in list(self.runners.values())
            if r.subdomain == subdomain and not r.host_network and not r.done.is_set()
        ]  # fmt: skip
        for runner in pods:
            runner.write_hosts([(p.pod_ip, p.hostname) for p in pods if p is not runner])

    def _mark_running(self, pod: dict[str, Any]) -> None:
        states = podstatus.containers_of(pod)
        for state in states:
            state.started_at = podstatus.stamp()
        status = podstatus.pod_status(
            "Running", states, start_time=podstatus.stamp(), pod_ip=self._address(pod)
        )
        self._patch(pod, status)
        self.marked.add(pod["metadata"]["uid"])

    def _terminate(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if meta["uid"] in self.terminating:
            return
        runner = self.runners.get(meta["uid"])
        if runner is not None and not runner.done.is_set():
            self.terminating.add(meta["uid"])
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            threading.Thread(
                target=self._finish_delete, args=(pod, runner, grace), daemon=True
            ).start()
            return
        self._delete_now(pod)

    def _finish_delete(self, pod: dict[str, Any], runner: PodRunner, grace: float) -> None:
        runner.terminate(grace)
        self._delete_now(pod)

    def _delete_now(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if meta.get("finalizers"):
            self._end_before_delete(pod)
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def _end_before_delete(self, pod: dict[str, Any]) -> None:
        """As a kubelet does, a deleted pod ends in a terminal phase (Failed: its containers
        were stopped) before its object goes; a controller whose finalizer holds the pod
        (Kueue's) waits for that phase to let it go."""
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        now = podstatus.stamp()
        states = podstatus.containers_of(pod)
        for state in states:
            state.started_at = state.started_at or status.get("startTime") or now
            state.exit_code, state.finished_at, state.reason = 137, now, "Error"
        ended = podstatus.pod_status(
            "Failed",
            states,
            start_time=status.get("startTime") or now,
            pod_ip=status.get("podIP") or podstatus.HOST_IP,
            reason="Terminated",
            message="the pod was deleted; its containers were stopped",
        )
        self._patch(pod, ended)

    def _forget(self, uid: str) -> None:
        self.marked.discard(uid)
        self.terminating.discard(uid)
        runner = self.runners.pop(uid, None)
        if runner is not None:
            if not runner.done.is_set():
                runner.terminate(grace=0)
            runner.remove()
            self._refresh_hosts(runner.subdomain)
        if uid in self.pod_ips:
            node, ip = self.pod_ips.pop(uid)
            self.network.detach(ip)
            self.addresses[node].release(ip)

    def _find(self, namespace: str, name: str) -> PodRunner | None:
        """The pod's runner (the newest, where a replacement took an old pod's name)."""
        found = None
        for runner in list(self.runners.values()):
            meta = runner.pod["metadata"]
            if (meta["namespace"], meta["name"]) == (namespace, name):
                found = runner
        return found

    def _patch(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}
            )
        except ApiException as err:
            if err.status != 404:  # a pod deleted meanwhile needs no status
                log.warning(
                    "pod %s/%s: status patch failed: %s",
                    meta["namespace"],
                    meta["name"],
                    err.reason,
                )


class ApiSource:
    """What pod volumes read from the API server, with the agent's credentials."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core

    def lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        read = (
            self.core.read_namespaced_secret
            if kind == "secret"
            else self.core.read_namespaced_config_map
        )
        try:
            obj = read(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return dict(obj.data or {})

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.lookup("configmap", namespace, name)

    def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.lookup("secret", namespace, name)

    def token(self, pod: Mapping[str, Any], *, audience: str | None, seconds: int) -> volumes.Token:
        """A service-account token bound to the pod (TokenRequest), as the kubelet asks."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        issued = volumes.now()
        resp = self.core.create_namespaced_service_account_token(account, meta["namespace"], body)
        expires = resp.status.expiration_timestamp
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=datetime.UTC)
        return volumes.Token(resp.status.token, issued, expires)

    def claim_path(self, namespace: str, claim: str) -> str | None:
        try:
            pvc = self.core.read_namespaced_persistent_volume_claim(claim, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        if pvc.status.phase != "Bound" or not pvc.spec.volume_name:
            return None
        pv = self.core.read_persistent_volume(pvc.spec.volume_name)
        source = pv.spec.host_path or pv.spec.local
        return str(source.path) if source is not None else None
