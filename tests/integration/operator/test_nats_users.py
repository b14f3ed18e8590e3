"""The operator signs each job a NATS user per role and policy, in a Secret the job owns,
and renews them before they expire while the job lives.

The session's operator holds `SESSION_TRUST`'s account signing key (tests/conftest.py), as
the chart's `nats.signingSecret` gives it one. What users may do is enforced by nats-server
(test_nats_access.py, and `polyrl run` in test_local_run.py), and how a worker survives its
user's expiry is in test_nats_user_expiry.py; here: the Secret, its owner, what each creds
file grants, which key each pod mounts, renewal with a lifetime of seconds (the node agent
re-syncing the pods' files, as a kubelet does), and that a deleted job's users go.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import SESSION_TRUST
from tests.operator_stack import FAKE_WORKERS

from polyrl.api import access, natsjwt
from polyrl.api.launch import NATS_USER_FILE, Role
from polyrl.api.naming import JobNames
from polyrl.operator import natsusers, render
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until

from .helpers import apply, find, get, job_doc, live, pods, reasons, wait_running


def creds_of(secret: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each key's JWT claims."""
    out = {}
    for key, value in secret["data"].items():
        text = base64.b64decode(value).decode()
        token = text.split("-----BEGIN NATS USER JWT-----\n")[1].split("\n")[0]
        out[key] = natsjwt.decode(token)
    return out


def pod_keys(kubectl: Kubectl, ns: str, job: str) -> dict[str, dict[str, Any]]:
    """Each live pod of the job: the Secret and key its creds file comes from."""
    found = {}
    for pod in live(pods(kubectl, ns, f"polyrl.dev/job={job}")):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        found[pod["metadata"]["name"]] = volumes[render.USER_VOLUME]["secret"]
    return found


def test_each_role_gets_its_own_signed_user_that_its_pods_read_and_the_job_owns(
    kubectl: Kubectl, ns: str
) -> None:
    doc = job_doc("users")
    apply(kubectl, ns, doc)
    secret = wait_until("the users Secret", lambda: find(kubectl, ns, "secret", "users-nats-users"))
    job = get(kubectl, ns, "rlj", "users")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    claims = creds_of(secret)
    assert set(claims) == {"workflow.creds", "trainer-solver.creds", "rollout-solver.creds"}
    names = JobNames(namespace=ns, job="users")
    for role, policy in [(Role.WORKFLOW, None), (Role.TRAINER, "solver"), (Role.ROLLOUT, "solver")]:
        signed = claims[access.creds_key(role, policy)]
        grant = access.grant(names, role, policy, ["solver"])
        assert signed["iss"] == SESSION_TRUST.signing.public
        assert signed["nats"]["issuer_account"] == SESSION_TRUST.account.public
        assert signed["nats"]["pub"]["allow"] == grant.publish
        assert signed["nats"]["sub"]["allow"] == grant.subscribe
    keys = wait_until(
        "the job's pods",
        lambda: found if len(found := pod_keys(kubectl, ns, "users")) >= 3 else None,
    )
    for pod, ref in keys.items():
        kind = "workflow" if "-workflow-" in pod else "trainer" if "-trainer-" in pod else "rollout"
        expected = "workflow.creds" if kind == "workflow" else f"{kind}-solver.creds"
        assert ref["secretName"] == "users-nats-users", pod
        assert ref["items"] == [{"key": expected, "path": NATS_USER_FILE}], pod
    expires = secret["metadata"]["annotations"][natsusers.A_EXPIRES]
    assert {c["exp"] for c in claims.values()} == {natsusers.parse_stamp(expires)}
    assert natsusers.parse_stamp(expires) == pytest.approx(time.time() + 24 * 3600, abs=120)
    assert "NatsUsers" in reasons(kubectl, ns, "users")

    doc["spec"]["policies"].append({"name": "judge", "model": {"path": "tiny-llama://j"}})
    apply(kubectl, ns, doc)
    wait_until(
        "the new policy's users",
        lambda: "rollout-judge.creds" in get(kubectl, ns, "secret", "users-nats-users")["data"],
    )
    again = get(kubectl, ns, "secret", "users-nats-users")["data"]
    assert again["trainer-solver.creds"] == secret["data"]["trainer-solver.creds"]  # kept
    assert "trainer-judge.creds" in again

    kubectl("delete", "rlj", "users", "-n", ns)
    wait_until(
        "the users Secret to go with its job",
        lambda: find(kubectl, ns, "secret", "users-nats-users") is None,
        timeout=60,
    )


TTL = 6  # seconds: renewed once less than 3 are left, so every 3 to 4 (resync: 1 s)


@pytest.fixture
def short_lived_users(operator: OperatorProcess, exec_ns: str) -> Iterator[str]:
    """`exec_ns`, with the operator signing users that last TTL seconds (then as before)."""
    operator.use(FAKE_WORKERS, settings={"POLYRL_NATS_USER_TTL": str(TTL)})
    try:
        yield exec_ns
    finally:
        operator.use(FAKE_WORKERS)


def mounted_creds(cluster: Cluster, ns: str, pod: dict[str, Any]) -> str:
    """The creds file the node agent keeps in the pod's users volume (what it reads)."""
    meta = pod["metadata"]
    sandbox = cluster.workdir / "agent" / "pods" / f"{ns}_{meta['name']}_{meta['uid']}"
    path: Path = sandbox / "volumes" / render.USER_VOLUME / NATS_USER_FILE
    return path.read_text()


def test_users_are_renewed_while_the_job_lives_and_reach_its_running_pods(
    kubectl: Kubectl, cluster: Cluster, short_lived_users: str
) -> None:
    ns = short_lived_users
    apply(kubectl, ns, job_doc("renew"))
    secret = wait_until("the users Secret", lambda: find(kubectl, ns, "secret", "renew-nats-users"))
    first = natsusers.parse_stamp(secret["metadata"]["annotations"][natsusers.A_EXPIRES])
    assert first is not None
    assert first <= time.time() + TTL
    [name] = wait_running(kubectl, ns, "polyrl.dev/role=rollout", 1)
    pod = get(kubectl, ns, "pod", name)

    def renewed() -> dict[str, Any] | None:
        now = get(kubectl, ns, "secret", "renew-nats-users")
        stamp = natsusers.parse_stamp(now["metadata"]["annotations"][natsusers.A_EXPIRES])
        return now if stamp is not None and stamp > first else None

    later = wait_until("the users to be renewed", renewed, timeout=3 * TTL)
    expires = natsusers.parse_stamp(later["metadata"]["annotations"][natsusers.A_EXPIRES])
    claims = creds_of(later)
    assert {c["exp"] for c in claims.values()} == {expires}  # every user, the same new exp
    assert all(later["data"][k] != secret["data"][k] for k in secret["data"])
    key = access.creds_key(Role.ROLLOUT, "solver")
    before = base64.b64decode(secret["data"][key]).decode()

    def pod_has_the_renewed_user() -> bool:
        # Renewals go on every few seconds: the file must match the Secret as it is now.
        now = get(kubectl, ns, "secret", "renew-nats-users")["data"][key]
        held = mounted_creds(cluster, ns, pod)
        return held != before and held == base64.b64decode(now).decode()

    # The node agent re-syncs the pod's volume, as a kubelet does.
    wait_until("the rollout pod's file to hold its renewed user", pod_has_the_renewed_user)
    assert get(kubectl, ns, "pod", name)["metadata"]["uid"] == pod["metadata"]["uid"]  # no restart
    assert "NatsUsersRenewed" in reasons(kubectl, ns, "renew")

    kubectl("delete", "rlj", "renew", "-n", ns)
    wait_until(
        "the users Secret to go with its job",
        lambda: find(kubectl, ns, "secret", "renew-nats-users") is None,
        timeout=60,
    )
    time.sleep(TTL / 2)  # a renewal's time: nothing renews (or re-creates) a deleted job's users
    assert find(kubectl, ns, "secret", "renew-nats-users") is None
