"""kopf registrations only: each handler is a few lines that call plain functions.

Every RLJob and PolicyGroup gets a daemon that runs its reconcile loop (`jobs.reconcile`,
`groups.reconcile`); watch events on pods, groups and jobs only wake those loops. Pods,
groups and jobs are mirrored into kopf indices, so a reconcile reads memory. The RLJob
delete handler is the finalizer that removes the job's NATS streams, bounded in time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from polyrl.api import naming
from polyrl.api.base import GROUP, VERSION
from polyrl.operator import groups, jobs, kube, metrics, podinfo, refused
from polyrl.operator.context import Context, Wakers
from polyrl.operator.natshub import NatsHub
from polyrl.operator.settings import OperatorSettings

MANAGED = {naming.L_MANAGED_BY: naming.MANAGED_BY}
RLJOBS = (GROUP, VERSION, "rljobs")
GROUPS = (GROUP, VERSION, "policygroups")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # we post our own events, one per transition
    settings.watching.server_timeout = 300
    managed = f"{naming.L_MANAGED_BY}={naming.MANAGED_BY}"
    settings.watching.label_selectors["v1", "pods"] = managed
    settings.watching.label_selectors["v1", "services"] = managed
    config = OperatorSettings.from_env()
    wakers = Wakers(progress_interval=config.status_progress_interval)
    client = kube.Kube(kube.load_client())
    hub = NatsHub(client, config, wakers.wake_pod)
    memo.ctx = Context(kube=client, hub=hub, settings=config, wakers=wakers)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await memo.ctx.hub.close()


@kopf.index("v1", "pods", labels=MANAGED)
def pods_index(body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any) -> Any:
    owner = labels.get(naming.L_GROUP) or f"job:{labels.get(naming.L_JOB)}"
    return {(namespace, owner): podinfo.from_body(body)}


@kopf.index("v1", "services", labels=MANAGED)
def services_index(namespace: str, name: str, **_: Any) -> Any:
    return {(namespace, name): True}


@kopf.index(*GROUPS)
def groups_index(body: kopf.Body, namespace: str, spec: kopf.Spec, **_: Any) -> Any:
    return {(namespace, spec.get("jobRef")): dict(body)}


@kopf.index(*RLJOBS)
def jobs_index(body: kopf.Body, namespace: str, name: str, **_: Any) -> Any:
    return {(namespace, name): dict(body)}


@kopf.on.event("v1", "pods", labels=MANAGED)
def pod_event(
    memo: kopf.Memo, namespace: str, name: str, labels: kopf.Labels, type: str, **_: Any
) -> None:
    wakers: Wakers = memo.ctx.wakers
    if labels.get(naming.L_GROUP):
        wakers.remember_pod(namespace, name, labels[naming.L_GROUP], gone=type == "DELETED")
        wakers.wake("group", namespace, labels[naming.L_GROUP])
    wakers.wake("job", namespace, labels.get(naming.L_JOB, ""))


@kopf.on.event("v1", "services", labels=MANAGED)
def service_event(memo: kopf.Memo, namespace: str, labels: kopf.Labels, **_: Any) -> None:
    memo.ctx.wakers.wake("group", namespace, labels.get(naming.L_GROUP, ""))


@kopf.on.event(*GROUPS)
def group_event(memo: kopf.Memo, namespace: str, name: str, spec: kopf.Spec, **_: Any) -> None:
    memo.ctx.wakers.wake("group", namespace, name)
    memo.ctx.wakers.wake("job", namespace, spec.get("jobRef", ""))


@kopf.on.event(*RLJOBS)
def job_event(
    memo: kopf.Memo, namespace: str, name: str, groups_index: kopf.Index[Any, Any], **_: Any
) -> None:
    memo.ctx.wakers.wake("job", namespace, name)
    for group in groups_index.get((namespace, name), []):
        memo.ctx.wakers.wake("group", namespace, group["metadata"]["name"])


def _first(index: kopf.Index[Any, Any], key: Any) -> Any:
    return next(iter(index.get(key, [])), None)


async def _sleep(
    ctx: Context, kind: str, namespace: str, name: str, stopped: kopf.DaemonStopped
) -> None:
    """Until woken, the resync is due, or kopf stops the daemon (the object was deleted, or
    the operator stops): a daemon that sleeps through its stop is cancelled by kopf, with a
    warning on every normal delete."""
    event = ctx.wakers.event(kind, namespace, name)
    interval = ctx.settings.status_interval

    async def stopping() -> None:
        await stopped.wait(interval)

    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopping())]
    await asyncio.wait(waits, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
    for waiting in waits:
        waiting.cancel()
    event.clear()
    await asyncio.sleep(0.02)  # let a burst of watch events land in the indices


async def _loop(
    ctx: Context,
    kind: str,
    namespace: str,
    name: str,
    stopped: kopf.DaemonStopped,
    logger: logging.Logger,
    step: Callable[[], Awaitable[None]],
) -> None:
    """Reconcile, sleep until woken or the resync is due, repeat until kopf stops us."""
    ctx.wakers.event(kind, namespace, name)
    try:
        while not stopped:
            try:
                await step()
            except Exception:  # a failed pass is retried on the next wake, never crashes
                metrics.RECONCILE_ERRORS.labels(kind=kind).inc()
                logger.exception("reconciling %s %s/%s failed; retrying", kind, namespace, name)
            await _sleep(ctx, kind, namespace, name, stopped)
    finally:
        ctx.wakers.forget(kind, namespace, name)
        metrics.forget_pods((kind, namespace, name))


@kopf.daemon(*GROUPS, cancellation_timeout=5.0)
async def group_loop(
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    body: kopf.Body,
    namespace: str,
    name: str,
    pods_index: kopf.Index[Any, Any],
    jobs_index: kopf.Index[Any, Any],
    services_index: kopf.Index[Any, Any],
    logger: logging.Logger,
    **_: Any,
) -> None:
    async def step() -> None:
        job = _first(jobs_index, (namespace, body["spec"].get("jobRef")))
        pods = list(pods_index.get((namespace, name), []))
        service = (namespace, naming.trainer_service(name)) in services_index
        await groups.reconcile(memo.ctx, body, pods, job, has_service=service)
        metrics.observe_pods(("group", namespace, name), pods)
        replicas = groups.load(body).spec.rollout.replicas
        metrics.observe_scale(("group", namespace, name), desired=replicas, pods=pods)

    await _loop(memo.ctx, "group", namespace, name, stopped, logger, step)


@kopf.daemon(*RLJOBS, cancellation_timeout=5.0)
async def job_loop(
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    body: kopf.Body,
    namespace: str,
    name: str,
    pods_index: kopf.Index[Any, Any],
    groups_index: kopf.Index[Any, Any],
    logger: logging.Logger,
    **_: Any,
) -> None:
    async def step() -> None:
        group_bodies = list(groups_index.get((namespace, name), []))
        pods = list(pods_index.get((namespace, f"job:{name}"), []))
        if await refused.job(memo.ctx.kube, body, pods):  # Failed, saying why
            metrics.RECONCILES.labels(kind="rljob").inc()  # a pass all the same
            return
        await jobs.reconcile(memo.ctx, body, group_bodies, pods)
        metrics.observe_pods(("job", namespace, name), pods)

    await _loop(memo.ctx, "job", namespace, name, stopped, logger, step)


@kopf.on.delete(*RLJOBS)
async def job_deleted(memo: kopf.Memo, body: kopf.Body, **_: Any) -> None:
    if refused.problems(body) is None:  # else its streams' server and names are unknown
        await jobs.cleanup(memo.ctx, body)
