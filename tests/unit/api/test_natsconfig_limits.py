"""The limits of a job's streams and buckets, as derived from the job (pure parts)."""

from __future__ import annotations

from nats.js.api import DiscardPolicy
from nats.js.errors import APIError, ServiceUnavailableError

from polyrl.api import natsconfig
from polyrl.api.naming import JobNames

NAMES = JobNames(namespace="ns", job="job")


def test_every_stream_of_a_job_has_a_limit() -> None:
    for config in natsconfig.streams(NAMES, ["solver", "verifier"]):
        limits = (config.max_msgs, config.max_bytes, config.max_msgs_per_subject, config.max_age)
        assert any(x not in (None, -1, 0) for x in limits), config.name


def test_the_request_queue_refuses_new_requests_at_its_cap_rather_than_dropping_old_ones() -> None:
    (requests,) = [
        c
        for c in natsconfig.streams(NAMES, ["solver"])
        if c.name == NAMES.requests_stream("solver")
    ]
    assert requests.discard == DiscardPolicy.NEW
    assert requests.max_msgs == natsconfig.REQUEST_CAP
    assert requests.max_age == natsconfig.REQUEST_MAX_AGE


def test_the_weights_bucket_limit_grows_with_the_model_and_the_keyframe_interval() -> None:
    mib = 1 << 20
    # 7B parameters in bf16 (14 GB) in 8 MiB chunks, a keyframe every 20 versions: 2 + 1
    # keyframes, 40 + 1 deltas, each at most the model's chunks plus a header and a meta message.
    seven_b = natsconfig.weights_bucket_messages(14_000 * mib, 8 * mib, 20)
    assert seven_b == 2 * (2 + 1 + 40 + 1) * (1750 + 2) + natsconfig.BUNDLE_MESSAGES
    assert natsconfig.weights_bucket_messages(28_000 * mib, 8 * mib, 20) > seven_b
    assert natsconfig.weights_bucket_messages(14_000 * mib, 8 * mib, 5) < seven_b
    # A tiny model still has room for its bundle.
    assert natsconfig.weights_bucket_messages(1000, 8 * mib, 20) > natsconfig.BUNDLE_MESSAGES


def test_only_a_limit_refusal_counts_as_full() -> None:
    full = ServiceUnavailableError(code=503, err_code=natsconfig.STREAM_FULL)
    assert natsconfig.is_full(full)
    assert not natsconfig.is_full(APIError(code=503, err_code=10047))  # insufficient resources
    assert not natsconfig.is_full(TimeoutError())
