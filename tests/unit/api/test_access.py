"""The access matrix names only its own job's subjects, and the JWTs carry it signed."""

from __future__ import annotations

import base64

import nkeys
import pytest

from polyrl.api import access, natsjwt
from polyrl.api.launch import Role
from polyrl.api.naming import JobNames

JOB = JobNames(namespace="team", job="math")
POLICIES = ["solver", "verifier"]
CASES = [(Role.ROLLOUT, "solver"), (Role.TRAINER, "solver"), (Role.WORKFLOW, None)]


def own_job(subject: str) -> bool:
    """Does `subject` belong to JOB (by its prefix, stream or bucket name, or inbox)?"""
    return any(
        part in subject
        for part in (
            JOB.prefix,
            "af-team-math-",
            "_i.team.math.",
            "$JS.API.STREAM.INFO.af-team-math",
        )
    )


@pytest.mark.parametrize(("role", "policy"), CASES)
def test_every_subject_a_role_is_granted_belongs_to_its_own_job(
    role: Role, policy: str | None
) -> None:
    grant = access.grant(JOB, role, policy, POLICIES)
    for subject in grant.publish + grant.subscribe:
        assert own_job(subject), subject
        assert not subject.startswith(">")
        assert "STREAM.CREATE" not in subject
        assert "STREAM.DELETE" not in subject
        assert "STREAM.NAMES" not in subject


def test_only_a_trainer_writes_weights_and_only_its_own_policys() -> None:
    writers = {
        (role, policy): [
            s for s in access.grant(JOB, role, policy, POLICIES).publish if s.startswith("$O.")
        ]
        for role, policy in CASES
    }
    assert writers[(Role.TRAINER, "solver")] == [f"$O.{JOB.weights_bucket('solver')}.>"]
    assert writers[(Role.ROLLOUT, "solver")] == []
    assert writers[(Role.WORKFLOW, None)] == []
    rollout = access.grant(JOB, Role.ROLLOUT, "solver", POLICIES).publish
    assert JOB.trajectories_subject("solver") not in rollout
    assert JOB.weights_subject("solver") not in rollout


def test_a_role_without_one_of_the_jobs_policies_is_refused() -> None:
    with pytest.raises(ValueError, match="needs one of the job's policies"):
        access.grant(JOB, Role.TRAINER, "judge", POLICIES)


def test_inbox_prefixes_differ_by_job_role_and_policy() -> None:
    other = JobNames(namespace="team", job="chat")
    prefixes = {
        access.inbox_prefix(names, role, policy)
        for names in (JOB, other)
        for role, policy in [*CASES, (Role.ROLLOUT, "verifier")]
    }
    assert len(prefixes) == 8


def test_a_user_jwt_is_signed_by_the_accounts_signing_key_and_carries_the_grant() -> None:
    trust = natsjwt.Trust.new()
    grant = access.grant(JOB, Role.ROLLOUT, "solver", POLICIES)
    creds = trust.signer.user_creds("math-rollout", grant, expires=2_000_000_000)
    token = creds.split("-----BEGIN NATS USER JWT-----\n")[1].split("\n")[0]
    seed = creds.split("-----BEGIN USER NKEY SEED-----\n")[1].split("\n")[0]
    claims = natsjwt.decode(token)
    assert claims["iss"] == trust.signing.public
    assert claims["iss"] != trust.account.public
    assert claims["nats"]["issuer_account"] == trust.account.public
    assert claims["nats"]["pub"]["allow"] == grant.publish
    assert claims["nats"]["sub"]["allow"] == grant.subscribe
    assert claims["sub"] == nkeys.from_seed(seed.encode()).public_key.decode()
    assert claims["exp"] == 2_000_000_000
    signed, signature = token.rsplit(".", 1)
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    verifier = nkeys.from_seed(trust.signing.seed.encode())
    assert verifier.verify(signed.encode(), raw)
    config = trust.server_config()
    assert trust.account.public in config
    assert trust.signing.seed not in config


def test_a_trainer_asks_only_its_own_pool_and_hears_only_its_own_answers() -> None:
    trainer = access.grant(JOB, Role.TRAINER, "solver", POLICIES)
    assert JOB.requests_subject("solver") in trainer.publish
    assert JOB.requests_subject("verifier") not in trainer.publish
    assert trainer.subscribe == [
        f"{access.inbox_prefix(JOB, Role.TRAINER, 'solver')}.>",
        JOB.eval_replies_subject("solver"),
    ]
    rollout = access.grant(JOB, Role.ROLLOUT, "solver", POLICIES).publish
    assert JOB.eval_replies_subject("solver") in rollout
    assert JOB.eval_replies_subject("verifier") not in rollout
    workflow = access.grant(JOB, Role.WORKFLOW, None, POLICIES).subscribe
    assert not any(s.endswith("eval-replies") for s in workflow)  # not the runners' replies


def test_a_shared_pools_grant_covers_exactly_the_policies_it_serves() -> None:
    pool = access.grant(JOB, Role.ROLLOUT, "solver", POLICIES, served=["verifier"])
    alone = access.grant(JOB, Role.ROLLOUT, "solver", POLICIES)
    for policy in ("solver", "verifier"):
        assert f"$JS.API.CONSUMER.MSG.NEXT.{JOB.requests_stream(policy)}.>" in pool.publish
        assert JOB.weights_subject(policy) in pool.subscribe
        assert JOB.eval_replies_subject(policy) in pool.publish
    assert JOB.weights_subject("verifier") not in alone.subscribe
    assert not any("verifier" in s for s in alone.publish + alone.subscribe)
    with pytest.raises(ValueError, match="cannot serve"):
        access.grant(JOB, Role.ROLLOUT, "solver", POLICIES, served=["solver"])
    with pytest.raises(ValueError, match="cannot serve"):
        access.grant(JOB, Role.ROLLOUT, "solver", POLICIES, served=["judge"])
