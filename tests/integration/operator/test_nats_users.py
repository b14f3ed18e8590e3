"""The operator signs each job a NATS user per role and policy, in a Secret the job owns.

The session's operator holds `SESSION_TRUST`'s account signing key (tests/conftest.py), as
the chart's `nats.signingSecret` gives it one. What users may do is enforced by nats-server
(test_nats_access.py, and `polyrl run` in test_local_run.py); here: the Secret, its owner,
what each creds file grants, which key each pod reads, and that a deleted job's users go.
"""

from __future__ import annotations

import base64
from typing import Any

from tests.conftest import SESSION_TRUST

from polyrl.api import access, natsjwt
from polyrl.api.launch import NATS_CREDS_ENV, Role
from polyrl.api.naming import JobNames
from polyrl.testing.kube import Kubectl, wait_for

from .helpers import apply, find, get, job_doc, live, pods, reasons


def creds_of(secret: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each key's JWT claims."""
    out = {}
    for key, value in secret["data"].items():
        text = base64.b64decode(value).decode()
        token = text.split("-----BEGIN NATS USER JWT-----\n")[1].split("\n")[0]
        out[key] = natsjwt.decode(token)
    return out


def pod_keys(kubectl: Kubectl, ns: str, job: str) -> dict[str, dict[str, str]]:
    """Each live pod of the job: the Secret and key its creds come from."""
    found = {}
    for pod in live(pods(kubectl, ns, f"polyrl.dev/job={job}")):
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        found[pod["metadata"]["name"]] = env[NATS_CREDS_ENV]["valueFrom"]["secretKeyRef"]
    return found


def test_each_role_gets_its_own_signed_user_that_its_pods_read_and_the_job_owns(
    kubectl: Kubectl, ns: str
) -> None:
    doc = job_doc("users")
    apply(kubectl, ns, doc)
    secret = wait_for("the users Secret", lambda: find(kubectl, ns, "secret", "users-nats-users"))
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
    keys = wait_for(
        "the job's pods",
        lambda: found if len(found := pod_keys(kubectl, ns, "users")) >= 3 else None,
    )
    for pod, ref in keys.items():
        kind = "workflow" if "-workflow-" in pod else "trainer" if "-trainer-" in pod else "rollout"
        expected = "workflow.creds" if kind == "workflow" else f"{kind}-solver.creds"
        assert ref == {"name": "users-nats-users", "key": expected}, pod
    assert "NatsUsers" in reasons(kubectl, ns, "users")

    doc["spec"]["policies"].append({"name": "judge", "model": {"path": "tiny-llama://j"}})
    apply(kubectl, ns, doc)
    wait_for(
        "the new policy's users",
        lambda: "rollout-judge.creds" in get(kubectl, ns, "secret", "users-nats-users")["data"],
    )
    again = get(kubectl, ns, "secret", "users-nats-users")["data"]
    assert again["trainer-solver.creds"] == secret["data"]["trainer-solver.creds"]  # kept
    assert "trainer-judge.creds" in again

    kubectl("delete", "rlj", "users", "-n", ns)
    wait_for(
        "the users Secret to go with its job",
        lambda: find(kubectl, ns, "secret", "users-nats-users") is None,
        timeout=60,
    )
