"""The agent's loops: node heartbeats, and a list-then-watch loop over pods.

Reconciling is level-based: every list and every watch event is handed to `reconcile(pod)`,
which compares the pod with what the agent runs and acts, so a missed event is repaired
by the next list (every `resync` seconds).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from polyrl.testing.nodeagent import nodes, podstatus
from polyrl.testing.nodeagent.runner import PodRunner

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
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.nodes = {n.name: n for n in nodes_}
        self.mode = mode
        self.workdir = workdir
        self.kube_version = kube_version
        self.lease_interval = lease_interval
        self.status_interval = status_interval
        self.resync = resync
        self.runners: dict[str, PodRunner] = {}  # by pod uid
        self.marked: set[str] = set()  # status-mode pods already reported Running
        self.terminating: set[str] = set()  # pods whose graceful deletion is under way
        self.stop = threading.Event()
        self._ns_modes: dict[str, tuple[float, str]] = {}

    def run(self) -> None:
        for spec in self.nodes.values():
            nodes.register(self.core, spec, self.kube_version)
            nodes.renew_lease(self.coord, spec.name)
        log.info("registered nodes %s (mode %s)", ", ".join(self.nodes), self.mode)
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
        for runner in list(self.runners.values()):
            runner.terminate(grace=5)

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

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        sandbox = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        runner = PodRunner(
            pod,
            sandbox=sandbox,
            lookup=self._lookup,
            patch_status=lambda status: self._patch(pod, status),
        )
        self.runners[meta["uid"]] = runner
        log.info("pod %s: starting in %s", runner.key, sandbox)
        runner.start()

    def _mark_running(self, pod: dict[str, Any]) -> None:
        states = podstatus.containers_of(pod)
        for state in states:
            state.started_at = podstatus.stamp()
        self._patch(pod, podstatus.pod_status("Running", states, start_time=podstatus.stamp()))
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
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def _forget(self, uid: str) -> None:
        self.marked.discard(uid)
        self.terminating.discard(uid)
        runner = self.runners.pop(uid, None)
        if runner is not None:
            if not runner.done.is_set():
                runner.terminate(grace=0)
            shutil.rmtree(runner.sandbox, ignore_errors=True)

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

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "secret":
                obj = self.core.read_namespaced_secret(name, namespace)
            else:
                obj = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return dict(obj.data or {})
