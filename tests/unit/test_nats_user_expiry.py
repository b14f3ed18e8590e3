"""Pure parts of expiring NATS users: when the operator renews a job's users, what it
records, the operator setting, and the file a pod reads its user from."""

from __future__ import annotations

from typing import Any

import pytest

from polyrl.api import access, plan
from polyrl.api.launch import (
    NATS_CREDS_ENV,
    NATS_CREDS_FILE_ENV,
    NATS_USER_FILE,
    NATS_USER_MOUNT,
)
from polyrl.api.resources import RLJob
from polyrl.operator import natsusers, render
from polyrl.operator.settings import OperatorSettings

TTL = 3600.0
NOW = 1_800_000_000.0
JOB: dict[str, Any] = {
    "metadata": {"name": "math", "namespace": "team", "uid": "u-1"},
    "spec": {
        "policies": [
            {"name": "solver", "model": {"path": "tiny-llama://s"}},
            {"name": "verifier", "model": {"path": "tiny-llama://v"}},
        ]
    },
}


@pytest.mark.parametrize(
    ("left", "due"),
    [
        (TTL, False),  # just signed
        (TTL / 2 + 1, False),
        (TTL / 2 - 1, True),  # less than half its lifetime left
        (-5.0, True),  # expired already (the operator was down)
        (TTL + 60, True),  # signed under a longer TTL than the one set now
    ],
)
def test_users_are_renewed_once_less_than_half_their_lifetime_is_left(
    left: float, due: bool
) -> None:
    assert natsusers.renewal_due(NOW + left, NOW, TTL) is due


def test_users_whose_secret_does_not_say_when_they_expire_are_renewed() -> None:
    assert natsusers.renewal_due(None, NOW, TTL)
    assert natsusers.parse_stamp(None) is None
    assert natsusers.parse_stamp("next tuesday") is None


def test_the_recorded_expiry_reads_back_as_the_time_it_was_written_from() -> None:
    written = natsusers.stamp(NOW)
    assert written == "2027-01-15T08:00:00Z"
    assert natsusers.parse_stamp(written) == NOW


def test_the_user_lifetime_is_a_day_unless_set_and_must_be_positive() -> None:
    assert OperatorSettings.from_env({}).nats_user_ttl == 24 * 3600
    assert OperatorSettings.from_env({"POLYRL_NATS_USER_TTL": "90"}).nats_user_ttl == 90
    with pytest.raises(ValueError, match="POLYRL_NATS_USER_TTL must be a positive number"):
        OperatorSettings.from_env({"POLYRL_NATS_USER_TTL": "0"})


def test_each_pod_mounts_only_its_own_users_key_as_a_file_the_kubelet_can_renew() -> None:
    job = RLJob.model_validate(JOB)
    launches = plan.plan(job, nats_url="nats://n:4222").launches
    assert {launch.role for launch in launches} == {"workflow", "trainer", "rollout"}
    for launch in launches:
        spec = render.pod(launch, namespace="team", owner={}, nats_users="math-nats-users")["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == render.USER_VOLUME)
        key = access.creds_key(launch.role, launch.policy)
        assert volume["secret"] == {
            "secretName": "math-nats-users",
            "items": [{"key": key, "path": NATS_USER_FILE}],
            "defaultMode": 0o440,
        }
        container = spec["containers"][0]
        mounts = [m for m in container["volumeMounts"] if m["name"] == render.USER_VOLUME]
        # A whole-volume mount: a subPath mount is never updated by the kubelet.
        assert mounts == [
            {"name": render.USER_VOLUME, "mountPath": NATS_USER_MOUNT, "readOnly": True}
        ]
        env = {e["name"]: e for e in container["env"]}
        assert env[NATS_CREDS_FILE_ENV] == {
            "name": NATS_CREDS_FILE_ENV,
            "value": f"{NATS_USER_MOUNT}/{NATS_USER_FILE}",
        }
        assert NATS_CREDS_ENV not in env  # the creds are never in the pod's environment
        plain = render.pod(launch, namespace="team", owner={})["spec"]
        assert all(v["name"] != render.USER_VOLUME for v in plain["volumes"])
