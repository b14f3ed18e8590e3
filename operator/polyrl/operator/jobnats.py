"""An RLJob's NATS: the server it stays on, its users, its streams and buckets.

A job's pods and its data live on one NATS server, so a job that names none keeps the
operator's default as it was when the job first ran, even once the default changes (`pin`).
Every pass then makes sure the job's per-role users are signed and current, or says that the
job's data is open to every pod where the operator signs none, and that its streams and
buckets exist (`ensure`); NATS out of reach is a condition and a retry, not a failure.
"""

from __future__ import annotations

from polyrl.api import naming
from polyrl.api.base import (
    ConditionStatus,
    ConditionType,
    find_condition,
)
from polyrl.operator import natsusers
from polyrl.operator.jobpass import JobReconcile
from polyrl.operator.natshub import NatsUnavailable

SHARED_NATS = (
    "the operator signs no NATS users (it runs with nats.insecure): this job's pods share "
    "NATS credentials, or none, so every pod that can reach the NATS server can read and "
    "write every job's data (docs/security.md)"
)
ISOLATED = (
    "each role of this job has a NATS user of its own, allowed only this job's subjects it needs"
)


async def pin(p: JobReconcile) -> None:
    """A job that names no NATS keeps the operator's as it was when the job first ran: its
    streams and pods are there. A changed default is said once per job and operator."""
    meta, default = p.job.metadata, p.ctx.settings.nats_url
    pinned = meta.annotations.get(naming.A_NATS_URL)
    if p.job.spec.nats.url:
        return
    if pinned is None:
        patch = {"metadata": {"annotations": {naming.A_NATS_URL: default}}}
        await p.ctx.kube.patch_custom("rljobs", p.ns, p.name, patch)
        meta.annotations[naming.A_NATS_URL] = default
    elif pinned != default and (p.ns, p.name, pinned) not in p.ctx.noted:
        p.ctx.noted.add((p.ns, p.name, pinned))
        p.event(
            "Normal",
            "NatsKept",
            f"this job stays on the NATS it started on ({pinned}); the operator's default is "
            f"now {default}, which new jobs use (docs/operator.md, 'Moving NATS')",
        )


async def ensure(p: JobReconcile) -> None:
    """The job's users, streams and buckets (none while it is suspended)."""
    if p.job.spec.suspend:
        return
    try:
        await _users(p)  # first: signing needs no NATS, and pods cannot start without them
        await p.ctx.hub.ensure_job(p.job)
    except NatsUnavailable as err:
        if _set(p, ConditionType.NATS_READY, False, "NatsUnreachable", f"{err}; retrying"):
            p.event("Warning", "NatsUnreachable", str(err))
        return
    if _set(
        p, ConditionType.NATS_READY, True, "StreamsReady", "the job's streams and buckets exist"
    ):
        p.event("Normal", "NatsReady", "created the job's NATS streams and buckets")


async def _users(p: JobReconcile) -> None:
    """Each role's own NATS user, where the operator has a signing key (natsusers), renewed
    before it expires. Without one (the operator's explicit opt-in, `nats_insecure`) the job
    says, in a condition and an event, that its data is open to every pod."""
    signer = await p.ctx.hub.signer()
    if signer is None:
        if _set(p, ConditionType.NATS_ISOLATED, False, "SharedNats", SHARED_NATS):
            p.event("Warning", "NatsNotIsolated", SHARED_NATS)
        return
    _set(p, ConditionType.NATS_ISOLATED, True, "SignedUsers", ISOLATED)
    done = await natsusers.ensure(p.ctx.kube, p.job, signer, ttl=p.ctx.settings.nats_user_ttl)
    if done is None:
        return
    if done.renewed:
        p.event("Normal", "NatsUsersRenewed", f"renewed NATS users until {done.expires}")
    else:
        p.event(
            "Normal", "NatsUsers", f"signed NATS users until {done.expires}: {', '.join(done.keys)}"
        )


def _set(p: JobReconcile, type_: ConditionType, ok: bool, reason: str, message: str) -> bool:
    """Set a condition; True when its status changed (worth an event)."""
    old = find_condition(p.status.conditions, type_)
    p.condition(type_, ok, reason, message)
    wanted = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
    return old is None or old.status != wanted
