"""RLJobs the API server accepted and the models refuse: reported once, never retried.

The CRD's schema and CEL rules refuse what they can say (polyrl.api.taskparams for a
dataset task's params). What only the models can refuse is a value the schema keeps as
given: a task's own params are preserved unknown fields, so `params: {digits: [1, 2]}`
reaches the operator, while a task param must be a scalar. Parsing such a job would fail
every reconcile pass with a traceback, and its finalizer with it, so the job is marked
`Failed` instead (reason `InvalidSpec`, the models' message naming the field), nothing is
started for it and its workflow runners are stopped (its groups stop their pods, `JobInvalid`).
Deleting it skips the NATS cleanup: the streams' server and names come from the spec, and a
job refused from the start never had any.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from polyrl.api.base import ConditionType, now_rfc3339, set_condition
from polyrl.api.resources import Metadata, Phase, RLJob, RLJobStatus
from polyrl.operator import report
from polyrl.operator.kube import Kube
from polyrl.operator.podinfo import PodInfo

REASON = "InvalidSpec"
log = logging.getLogger("polyrl.operator.refused")


def explain(err: ValidationError) -> str:
    """One `field: problem` per error, as `polyrl run` prints them."""
    return "; ".join(
        f"{'.'.join(str(part) for part in e['loc']) or '(top level)'}: {e['msg']}"
        for e in err.errors()
    )


def problems(body: Mapping[str, Any]) -> str | None:
    """Why the models refuse the RLJob `body` (its metadata and spec); None if they take it."""
    try:
        RLJob.model_validate({"metadata": dict(body["metadata"]), "spec": dict(body["spec"])})
    except ValidationError as err:
        return explain(err)
    return None


async def job(kube: Kube, body: Mapping[str, Any], pods: Sequence[PodInfo]) -> bool:
    """False if the models take the RLJob `body`; else True, with the job marked Failed and
    its own pods (workflow runners) deleted."""
    why = problems(body)
    if why is None:
        return False
    for pod in pods:
        if not pod.deleting:
            await kube.delete_pod(pod.namespace, pod.name, pod.uid)
    meta = Metadata.model_validate(body["metadata"])
    before = RLJobStatus.model_validate(body.get("status") or {})
    after = before.model_copy(deep=True)
    if after.phase != Phase.FAILED:
        after.phase, after.completion_time = Phase.FAILED, now_rfc3339()
    changed = False
    for type_, ok in (
        (ConditionType.READY, False),
        (ConditionType.STOPPED, True),
        (ConditionType.FAILED, True),
    ):
        changed |= set_condition(
            after.conditions,
            type=type_,
            status=ok,
            reason=REASON,
            message=why,
            generation=meta.generation,
        )
    after.observed_generation = meta.generation
    if changed:
        log.info("%s/%s: the spec cannot run: %s", meta.namespace, meta.name, why)
    events = [("Warning", REASON, f"the spec cannot run: {why}")] if changed else []
    await report.publish(
        kube,
        kind="RLJob",
        plural="rljobs",
        meta=meta,
        before=before,
        after=after,
        events=events,
    )
    return True
