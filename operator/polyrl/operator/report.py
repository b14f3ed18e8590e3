"""What a reconcile pass tells the world: its status, patched only on change, and its events.

Shared by the RLJob and PolicyGroup passes: both load their object from a kopf body into
the API model, collect events while they act, and end by patching status (nothing when it
is unchanged, which is what keeps idle objects free of API traffic) and posting the events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from polyrl.api.base import API_VERSION, ApiModel, ConditionStatus, ConditionType, set_condition
from polyrl.api.resources import Phase
from polyrl.operator.kube import Kube

M = TypeVar("M", bound=ApiModel)
Event = tuple[str, str, str]  # (type, reason, message)


class Recorder:
    """What a pass collects as it acts: events to post and conditions to set on its status.

    A pass dataclass mixes this in and provides `status` (with `conditions`), `events` and
    `generation` (the object's metadata.generation the conditions are observed against).
    """

    status: Any
    events: list[Event]

    @property
    def generation(self) -> int:
        raise NotImplementedError

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def condition(
        self, type_: ConditionType, ok: bool | ConditionStatus, reason: str, message: str = ""
    ) -> None:
        set_condition(
            self.status.conditions,
            type=type_,
            status=ok,
            reason=reason,
            message=message,
            generation=self.generation,
        )


def load(model: type[M], body: Mapping[str, Any]) -> M:
    """An RLJob or PolicyGroup from a kopf body (metadata kept, status defaulted)."""
    return model.model_validate(
        {
            "metadata": dict(body["metadata"]),
            "spec": dict(body["spec"]),
            "status": dict(body.get("status") or {}),
        }
    )


async def publish(
    kube: Kube,
    *,
    kind: str,
    plural: str,
    meta: Any,
    before: Any,
    after: Any,
    events: Sequence[Event],
) -> None:
    """Patch `after` if it differs from `before`; post a PhaseChanged event and `events`."""
    posted = list(events)
    new = after.to_api()
    if new != before.to_api():
        await kube.patch_status(plural, meta.namespace, meta.name, new)
        if before.phase != after.phase:
            type_ = "Warning" if after.phase == Phase.FAILED else "Normal"
            posted.append((type_, "PhaseChanged", f"phase {before.phase} -> {after.phase}"))
    obj = {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid},
    }
    for type_, reason, message in posted:
        await kube.event(obj, type=type_, reason=reason, message=message)
