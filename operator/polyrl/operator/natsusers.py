"""Per-job NATS users: a creds file for each role and policy, in a Secret the RLJob owns.

With a signing Secret configured (`OperatorSettings.nats_signing_secret`: the account's
public key and a signing key's seed), the operator signs, for every job, a workflow user,
and a trainer and a rollout user per policy, each with exactly the subjects
`polyrl.api.access` grants. They go into `<job>-nats-users` in the job's namespace, owned by
the RLJob (deleted with it), and each pod mounts only its own key as a file
(`render.user_volume`). A Secret that exists is not signed again: a restarted operator finds
it, and a policy added to the job gets its keys added.

Users expire (`OperatorSettings.nats_user_ttl`), because polyrl cannot revoke them: that
needs the NATS operator key, which signs the account, and polyrl holds only the account's
signing key. The Secret records when its users expire (`A_EXPIRES`); each reconcile pass of
a live job re-signs all of them once less than half their lifetime is left (`renewal_due`),
the kubelet replaces the pods' files, and the workers' connections read them when the
server drops the expired ones (`polyrl.api.natsclient`). A deleted job's Secret goes with
it and nothing renews its users, so every copy of them stops working within the TTL.

The operator itself connects as an admin user it signs the same way (without expiry: it
never leaves the operator's process, which holds the signing key anyway), unless the
credentials Secret gives it a token or creds of its own.
"""

from __future__ import annotations

import base64
import datetime
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from polyrl.api import access, natsjwt
from polyrl.api.base import RFC3339
from polyrl.api.launch import Role
from polyrl.api.naming import L_JOB, L_MANAGED_BY, LABEL_PREFIX, MANAGED_BY, JobNames
from polyrl.api.resources import RLJob
from polyrl.operator import render
from polyrl.operator.kube import Kube
from polyrl.operator.settings import OperatorSettings

log = logging.getLogger("polyrl.operator")

ACCOUNT_KEY, SEED_KEY = "account", "seed"
A_EXPIRES = f"{LABEL_PREFIX}/nats-users-expire"  # when the Secret's users expire (RFC 3339)


class SigningKeyInvalid(ValueError):
    """The signing Secret lacks a key or holds something that is not an account seed."""


def secret_name(job: str) -> str:
    return f"{job}-nats-users"


def secret_for(job: RLJob, settings: OperatorSettings) -> str | None:
    """The Secret a job's pods read their creds from, where the operator signs users."""
    return secret_name(job.metadata.name) if settings.nats_signing_secret else None


def users(job: RLJob) -> Iterator[tuple[Role, str | None]]:
    """Every NATS user the job's pods connect as: a trainer per policy (a publisher for a
    frozen one); none for the rollout pods a policy served by another policy's pool does
    not have."""
    yield Role.WORKFLOW, None
    for policy in job.spec.policies:
        yield (Role.PUBLISHER if policy.frozen else Role.TRAINER), policy.name
        if policy.rollout.served_by is None:
            yield Role.ROLLOUT, policy.name


def signer_from(data: dict[str, str], where: str) -> natsjwt.Signer:
    """The signer in a Secret's data (base64 values, as the API returns them)."""
    missing = [k for k in (ACCOUNT_KEY, SEED_KEY) if k not in data]
    if missing:
        raise SigningKeyInvalid(f"{where} has no {' or '.join(missing)} key")
    account = base64.b64decode(data[ACCOUNT_KEY]).decode().strip()
    seed = base64.b64decode(data[SEED_KEY]).decode().strip()
    if not (account.startswith("A") and seed.startswith("SA")):
        raise SigningKeyInvalid(
            f"{where}: `account` must be an account key (A...), `seed` an account seed (SA...)"
        )
    return natsjwt.Signer(account, natsjwt.Key(seed))


def signed(
    job: RLJob, signer: natsjwt.Signer, wanted: list[tuple[Role, str | None]], *, expires: int
) -> dict[str, str]:
    """Creds for `wanted` users of `job`, valid until `expires`, base64 as a Secret's data."""
    names = JobNames(namespace=job.metadata.namespace, job=job.metadata.name)
    policies = [p.name for p in job.spec.policies]
    data = {}
    for role, policy in wanted:
        served = job.spec.served_in_pool(policy)[1:] if role == Role.ROLLOUT and policy else []
        grant = access.grant(names, role, policy, policies, served=served)
        name = (
            f"{names.namespace}/{names.job}/{access.creds_key(role, policy).removesuffix('.creds')}"
        )
        data[access.creds_key(role, policy)] = base64.b64encode(
            signer.user_creds(name, grant, expires=expires).encode()
        ).decode()
    return data


def renewal_due(expires: float | None, now: float, ttl: float) -> bool:
    """Re-sign a job's users: less than half their lifetime is left, the Secret does not say
    when they expire (an older operator made it), or they outlive what the TTL allows now
    (it was lowered)."""
    if expires is None:
        return True
    left = expires - now
    return left < ttl / 2 or left > ttl


def stamp(when: float) -> str:
    """`when` as the Secret records it (RFC 3339, UTC, whole seconds, as `exp` is)."""
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime(RFC3339)


def parse_stamp(text: str | None) -> float | None:
    """The time `stamp` wrote; None for none, or for what is not such a time."""
    try:
        when = datetime.datetime.strptime(text or "", RFC3339)
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.UTC).timestamp()


@dataclass(frozen=True, slots=True)
class Signed:
    """What `ensure` signed: the keys, until when, and whether it renewed every user."""

    keys: list[str]
    expires: str
    renewed: bool


async def ensure(kube: Kube, job: RLJob, signer: natsjwt.Signer, *, ttl: float) -> Signed | None:
    """The job's users Secret holds a live user for every role and policy: missing keys are
    added, and every user is re-signed when `renewal_due`. None when nothing was signed."""
    namespace, name = job.metadata.namespace, secret_name(job.metadata.name)
    found = await kube.find_secret(namespace, name)
    now = time.time()
    recorded = None if found is None else parse_stamp(found[0].get(A_EXPIRES))
    renew = found is not None and renewal_due(recorded, now, ttl)
    if found is None or renew or recorded is None:
        expires, wanted = int(now + ttl), list(users(job))
    else:  # new keys live as long as the others, so that one renewal covers them all
        expires = int(recorded)
        wanted = [u for u in users(job) if access.creds_key(*u) not in found[1]]
    if not wanted:
        return None
    data = signed(job, signer, wanted, expires=expires)
    annotations = {A_EXPIRES: stamp(expires)}
    if found is None:
        await _create(kube, job, data, annotations)
    else:
        await kube.add_to_secret(namespace, name, data, annotations=annotations)
    log.info(
        "%s NATS users for %s/%s until %s: %s",
        "renewed" if renew else "signed",
        namespace,
        job.metadata.name,
        annotations[A_EXPIRES],
        ", ".join(sorted(data)),
    )
    return Signed(keys=sorted(data), expires=annotations[A_EXPIRES], renewed=renew)


async def _create(
    kube: Kube, job: RLJob, data: dict[str, str], annotations: dict[str, str]
) -> None:
    owner = render.owner_ref("RLJob", job.metadata.name, job.metadata.uid or "")
    meta = {
        "name": secret_name(job.metadata.name),
        "namespace": job.metadata.namespace,
        "labels": {L_JOB: job.metadata.name, L_MANAGED_BY: MANAGED_BY},
        "annotations": annotations,
        "ownerReferences": [owner],
    }
    await kube.create_secret(
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "data": data}
    )
