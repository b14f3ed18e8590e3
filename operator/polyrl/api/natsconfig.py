"""Creating and removing a job's NATS streams and buckets: one function each, idempotent.

The operator calls `ensure` when a job appears, `polyrl run` calls it at start, and workers
call it before they use anything, so whoever comes first creates and the rest find. Limits
are deliberate: requests are a work queue (a message lives until a rollout worker acks it,
at most `REQUEST_CAP` of them); trajectories keep a de-duplication window so a retried
publish never doubles a sample; weight announcements keep the last few per policy; a weights
bucket is bounded by its trainer (`bound_weights`); heartbeats expire after a minute.
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError

from polyrl.api.naming import JobNames

HEARTBEAT_TTL = 60.0
DEDUPE_WINDOW = 600.0
TRAJECTORY_CAP = 1_000_000
# Requests waiting for a rollout worker, per policy: far above what the workflow runners keep
# in flight, so only a queue that nobody serves reaches it; then publishing fails (discard
# new) instead of the oldest requests vanishing.
REQUEST_CAP = 100_000
REQUEST_MAX_AGE = 6 * 3600.0  # a request older than this has long been retried under a new id
# JetStream's error code when a stream with discard-new is at its message or byte limit.
STREAM_FULL = 10077
# Messages in a weights bucket beyond its weight objects: the model bundle (config and
# tokenizer files) and evaluation handoffs.
BUNDLE_MESSAGES = 1024


def is_full(err: BaseException) -> bool:
    """A publish refused because its stream is at a limit (`STREAM_FULL`)."""
    return isinstance(err, APIError) and err.err_code == STREAM_FULL


def weights_bucket_messages(
    model_bytes: int,
    chunk_bytes: int,
    keyframe_every: int,
    keep_keyframes: int = 2,
    *,
    parts: int = 1,
) -> int:
    """The message limit of a policy's weights bucket, derived from the model and the
    retention the trainer runs (`polyrl.workers.retention`).

    A message limit, not a byte limit, because JetStream reserves `max_bytes` up front; chunks
    are full-sized but the last of each object, so messages bound bytes as well. Retention
    keeps `keep_keyframes` keyframes and the deltas from the older one on (at most
    `keep_keyframes * keyframe_every`), with one keyframe and one delta in flight; no object
    is larger than the model (a delta falls back to the whole tensors) plus its header, and
    each has one more message for its metadata. Twice that leaves room for the short delta
    chains live replicas still need. At the limit the trainer stops with `WeightsBucketFull`.
    An object in `parts` (a sharded trainer's) has a last chunk and a metadata message per part.
    """
    per_object = -(-model_bytes // chunk_bytes) + 2 * parts
    objects = keep_keyframes + 1 + keep_keyframes * keyframe_every + 1
    return 2 * objects * per_object + BUNDLE_MESSAGES


def streams(names: JobNames, policies: Sequence[str]) -> list[StreamConfig]:
    configs = [
        StreamConfig(
            name=names.dead_letter_stream,
            subjects=[names.dead_letter_subject],
            max_age=7 * 86400.0,
            max_msgs=100_000,
            storage=StorageType.FILE,
        )
    ]
    for p in policies:
        configs += [
            StreamConfig(
                name=names.requests_stream(p),
                subjects=[names.requests_subject(p)],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=DEDUPE_WINDOW,
                max_msgs=REQUEST_CAP,
                max_age=REQUEST_MAX_AGE,
                discard=DiscardPolicy.NEW,
            ),
            StreamConfig(
                name=names.trajectories_stream(p),
                subjects=[names.trajectories_subject(p)],
                duplicate_window=DEDUPE_WINDOW,
                max_age=86400.0,
                # A message cap, not max_bytes: JetStream reserves max_bytes up front, so a
                # byte cap per policy would exhaust a server's store after a few jobs.
                max_msgs=TRAJECTORY_CAP,
                discard=DiscardPolicy.OLD,
                storage=StorageType.FILE,
            ),
            StreamConfig(
                name=names.weights_stream(p),
                subjects=[names.weights_subject(p)],
                max_msgs_per_subject=64,
                storage=StorageType.FILE,
            ),
        ]
    return configs


async def ensure(js: JetStreamContext, names: JobNames, policies: Sequence[str]) -> None:
    """Create (or update in place) every stream and bucket of the job."""
    for config in streams(names, policies):
        try:
            await js.stream_info(config.name or "")
            await js.update_stream(config)
        except NotFoundError:
            await js.add_stream(config)
    await js.create_key_value(
        KeyValueConfig(bucket=names.heartbeats_bucket, ttl=HEARTBEAT_TTL, history=1)
    )
    for p in policies:
        # nats-py overwrites config.bucket with the positional name: pass both.
        bucket = names.weights_bucket(p)
        try:  # found as it is: its trainer may have bounded it (`bound_weights`)
            await js.object_store(bucket)
        except (BucketNotFoundError, NotFoundError):
            await js.create_object_store(
                bucket, config=ObjectStoreConfig(bucket=bucket, storage=StorageType.FILE)
            )


async def bound_weights(js: JetStreamContext, names: JobNames, policy: str, max_msgs: int) -> None:
    """Set the message limit of `policy`'s weights bucket (`weights_bucket_messages`): the
    trainer does, once it knows its model's size."""
    stream = f"OBJ_{names.weights_bucket(policy)}"
    config = (await js.stream_info(stream)).config
    if config.max_msgs != max_msgs:
        config.max_msgs = max_msgs
        await js.update_stream(config)


async def remove(js: JetStreamContext, names: JobNames, policies: Sequence[str]) -> list[str]:
    """Delete every stream and bucket of the job; returns what existed and was removed."""
    removed = []
    for config in streams(names, policies):
        try:
            await js.delete_stream(config.name or "")
            removed.append(config.name or "")
        except NotFoundError:
            pass
    buckets = [names.heartbeats_bucket, *(names.weights_bucket(p) for p in policies)]
    for bucket in buckets:
        for delete in (js.delete_key_value, js.delete_object_store):
            try:
                if await delete(bucket):
                    removed.append(bucket)
                    break
            except (BucketNotFoundError, NotFoundError):
                continue
    return removed
