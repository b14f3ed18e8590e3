"""Watching the benchmark's pods: when each was first seen, ran, and started leaving."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from polyrl.api import naming
from polyrl.bench.operator_common import NAMESPACE, WATCH_SECONDS


@dataclass(slots=True)
class SeenPod:
    name: str
    labels: dict[str, str]
    added: float
    running: float | None = None
    ready: float | None = None  # its Ready condition True (the worker serves: its probe)
    leaving: float | None = None  # deletionTimestamp seen, or the pod is gone


Predicate = Callable[[dict[str, SeenPod]], float | None]


@dataclass
class PodWatch:
    """Every pod of the namespace by UID, with when this process first saw it exist, run
    and leave. A daemon thread follows one watch; `wait` blocks on a predicate over it."""

    api: client.ApiClient
    namespace: str = NAMESPACE
    pods: dict[str, SeenPod] = field(default_factory=dict)
    error: BaseException | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        core = client.CoreV1Api(self.api)
        listed = core.list_namespaced_pod(self.namespace, _preload_content=False)
        doc = json.loads(listed.data)
        for item in doc["items"]:
            self._record("ADDED", item)
        version = doc["metadata"]["resourceVersion"]
        self._thread = threading.Thread(
            target=self._follow, args=(version,), name="pod-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ends within one short watch (WATCH_SECONDS): a response cannot be closed safely
        from another thread while it is being read."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=WATCH_SECONDS + 5)

    def _follow(self, version: str) -> None:
        core = client.CoreV1Api(self.api)
        try:
            while not self._stopped.is_set():
                version = self._follow_once(core, version)
        except BaseException as err:  # surfaced by wait()
            self.error = err
            with self._cond:
                self._cond.notify_all()

    def _follow_once(self, core: client.CoreV1Api, version: str) -> str:
        """One watch request from `version`; returns the last version seen."""
        resp = core.list_namespaced_pod(
            self.namespace,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
        )
        try:
            for line in iter_resp_lines(resp):
                if not line:
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    raise RuntimeError(f"pod watch failed: {event['object']}")
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    self._record(event["type"], event["object"])
        finally:
            resp.close()
            resp.release_conn()
        return version

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        meta, status = obj["metadata"], obj.get("status") or {}
        with self._cond:
            seen = self.pods.get(meta["uid"])
            if seen is None:
                seen = self.pods[meta["uid"]] = SeenPod(meta["name"], meta.get("labels") or {}, now)
            if seen.running is None and status.get("phase") == "Running":
                seen.running = now
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            if seen.ready is None and ready:
                seen.ready = now
            if seen.leaving is None and (kind == "DELETED" or meta.get("deletionTimestamp")):
                seen.leaving = now
            self._cond.notify_all()

    def snapshot(self) -> dict[str, SeenPod]:
        with self._cond:
            return dict(self.pods)

    def wait(self, what: str, predicate: Predicate, timeout: float) -> float:
        """Block until `predicate(pods)` returns a time, and return it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.error is not None:
                    raise RuntimeError(f"pod watch stopped: {self.error!r}")
                found = predicate(self.pods)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
                self._cond.wait(min(left, 1.0))


def nth_time(times: list[float], n: int) -> float | None:
    """When the n-th of these events happened, or None before that."""
    if n <= 0:
        return time.monotonic()
    return sorted(times)[n - 1] if len(times) >= n else None


def pods_of_job(job: str, count: int) -> Predicate:
    return lambda pods: nth_time(
        [p.added for p in pods.values() if p.labels.get(naming.L_JOB) == job], count
    )


def rollouts_of(group: str, pods: dict[str, SeenPod]) -> dict[str, SeenPod]:
    return {
        uid: p
        for uid, p in pods.items()
        if p.labels.get(naming.L_GROUP) == group and p.labels.get(naming.L_ROLE) == "rollout"
    }


def new_rollouts(group: str, before: set[str], count: int) -> Predicate:
    return lambda pods: nth_time(
        [p.added for uid, p in rollouts_of(group, pods).items() if uid not in before], count
    )


def all_running(uids: set[str]) -> Predicate:
    return lambda pods: nth_time(
        [p.running for uid, p in pods.items() if uid in uids and p.running is not None],
        len(uids),
    )


def all_ready(uids: set[str]) -> Predicate:
    return lambda pods: nth_time(
        [p.ready for uid, p in pods.items() if uid in uids and p.ready is not None],
        len(uids),
    )


def leaving_rollouts(group: str, before: set[str], count: int) -> Predicate:
    return lambda pods: nth_time(
        [p.leaving for uid, p in rollouts_of(group, pods).items() if uid in before and p.leaving],
        count,
    )


def active_rollouts(group: str, watch: PodWatch) -> set[str]:
    return {uid for uid, p in rollouts_of(group, watch.snapshot()).items() if p.leaving is None}


# --- the environment ----------------------------------------------------------------------
