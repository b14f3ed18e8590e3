"""Per-job NATS users: a creds file for each role and policy, in a Secret the RLJob owns.

With a signing Secret configured (`OperatorSettings.nats_signing_secret`: the account's
public key and a signing key's seed), the operator signs, for every job, a workflow user,
and a trainer and a rollout user per policy, each with exactly the subjects
`polyrl.api.access` grants. They go into `<job>-nats-users` in the job's namespace, owned by
the RLJob (deleted with it), and each pod reads only its own key (`POLYRL_NATS_CREDS`, a
`secretKeyRef`). A Secret that exists is not signed again: a restarted operator finds it, and
a policy added to the job gets its keys added. The operator itself connects as an admin user
it signs the same way, unless the credentials Secret gives it a token or creds of its own.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

from polyrl.api import access, natsjwt
from polyrl.api.launch import Role
from polyrl.api.naming import L_JOB, L_MANAGED_BY, MANAGED_BY, JobNames
from polyrl.api.resources import RLJob
from polyrl.operator import render
from polyrl.operator.kube import Kube
from polyrl.operator.settings import OperatorSettings

log = logging.getLogger("polyrl.operator")

ACCOUNT_KEY, SEED_KEY = "account", "seed"


class SigningKeyInvalid(ValueError):
    """The signing Secret lacks a key or holds something that is not an account seed."""


def secret_name(job: str) -> str:
    return f"{job}-nats-users"


def secret_for(job: RLJob, settings: OperatorSettings) -> str | None:
    """The Secret a job's pods read their creds from, where the operator signs users."""
    return secret_name(job.metadata.name) if settings.nats_signing_secret else None


def users(job: RLJob) -> Iterator[tuple[Role, str | None]]:
    yield Role.WORKFLOW, None
    for policy in job.spec.policies:
        yield Role.TRAINER, policy.name
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
    job: RLJob, signer: natsjwt.Signer, wanted: list[tuple[Role, str | None]]
) -> dict[str, str]:
    """Creds for `wanted` users of `job`, base64 as a Secret's data."""
    names = JobNames(namespace=job.metadata.namespace, job=job.metadata.name)
    policies = [p.name for p in job.spec.policies]
    data = {}
    for role, policy in wanted:
        grant = access.grant(names, role, policy, policies)
        name = (
            f"{names.namespace}/{names.job}/{access.creds_key(role, policy).removesuffix('.creds')}"
        )
        data[access.creds_key(role, policy)] = base64.b64encode(
            signer.user_creds(name, grant).encode()
        ).decode()
    return data


async def ensure(kube: Kube, job: RLJob, signer: natsjwt.Signer) -> list[str]:
    """The job's users Secret holds a user for every role and policy; returns keys added."""
    namespace, name = job.metadata.namespace, secret_name(job.metadata.name)
    existing = await kube.find_secret(namespace, name)
    wanted = [u for u in users(job) if existing is None or access.creds_key(*u) not in existing]
    if not wanted:
        return []
    data = signed(job, signer, wanted)
    if existing is None:
        owner = render.owner_ref("RLJob", job.metadata.name, job.metadata.uid or "")
        labels = {L_JOB: job.metadata.name, L_MANAGED_BY: MANAGED_BY}
        meta = {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": [owner]}
        await kube.create_secret(
            {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "data": data}
        )
    else:
        await kube.add_to_secret(namespace, name, data)
    log.info(
        "signed NATS users for %s/%s: %s", namespace, job.metadata.name, ", ".join(sorted(data))
    )
    return sorted(data)
