"""What every reconcile needs, bundled: API access, NATS, settings and the wake-up registry.

Reconciling is level-based and runs in one loop per object (a kopf daemon). The loop
sleeps until the status interval passes or something relevant changes: a watch event on
the object, one of its pods, its job or group, or a Drained message. `wake` is how those
events reach the loops without any API call.

Progress (a trainer's step, a replica's weight version) changes several times a second on
a small model, and each change would be a status patch: `wake_pod(..., progress=True)`
wakes a pod's group at once for the first such news, then at most once per
`progress_interval` (the news in between wait for that one wake). A change of a worker's
state (serving, draining, done) is never held back.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

from polyrl.operator.kube import Kube
from polyrl.operator.natshub import NatsHub
from polyrl.operator.settings import OperatorSettings


@dataclass
class Wakers:
    events: dict[tuple[str, str, str], asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event)
    )
    pod_groups: dict[tuple[str, str], str] = field(default_factory=dict)
    progress_interval: float = 5.0
    last_progress: dict[tuple[str, str], float] = field(default_factory=dict)  # by group
    progress_due: set[tuple[str, str]] = field(default_factory=set)  # a delayed wake is set

    def event(self, kind: str, namespace: str, name: str) -> asyncio.Event:
        return self.events[(kind, namespace, name)]

    def wake(self, kind: str, namespace: str, name: str) -> None:
        if name == "*":
            for (k, ns, _), ev in list(self.events.items()):
                if k == kind and ns == namespace:
                    ev.set()
            return
        if (kind, namespace, name) in self.events:
            self.events[(kind, namespace, name)].set()

    def remember_pod(self, namespace: str, pod: str, group: str, *, gone: bool = False) -> None:
        """Which group a pod belongs to, so NATS news about a pod wakes its group."""
        if gone:
            self.pod_groups.pop((namespace, pod), None)
        else:
            self.pod_groups[(namespace, pod)] = group

    def wake_pod(self, namespace: str, pod: str, *, progress: bool = False) -> None:
        group = self.pod_groups.get((namespace, pod))
        if group is None:
            return
        if not progress:
            self.wake("group", namespace, group)
            return
        key = (namespace, group)
        if key in self.progress_due:
            return  # the wake already set up carries this news too
        loop = asyncio.get_running_loop()
        wait = self.last_progress.get(key, -self.progress_interval) + self.progress_interval
        wait -= loop.time()
        if wait <= 0:
            self._progress(key)
        else:
            self.progress_due.add(key)
            loop.call_later(wait, self._progress, key)

    def _progress(self, key: tuple[str, str]) -> None:
        self.progress_due.discard(key)
        self.last_progress[key] = asyncio.get_running_loop().time()
        self.wake("group", *key)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self.events.pop((kind, namespace, name), None)


@dataclass
class Context:
    kube: Kube
    hub: NatsHub
    settings: OperatorSettings
    wakers: Wakers
    drain_requested: set[tuple[str, str]] = field(default_factory=set)
    claims: set[tuple[str, str, str]] = field(default_factory=set)  # (ns, claim, job uid) made
    noted: set[tuple[str, str, str]] = field(default_factory=set)  # (ns, job, url) said kept
