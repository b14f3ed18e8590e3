"""The message that says a weight object is ready: one per object, on the policy's weights subject.

The trainer writes the object first and announces it after, so an announced object is complete. A
replica reads only the newest announcement (the stream keeps the last few per subject): it names
the latest version, and for a replica that holds the announced delta's base it names the one
object to fetch without listing the bucket, which saves round trips on a distant link. At a
keyframe version the trainer announces the keyframe first and the delta last, so the newest
announcement is the delta that up-to-date replicas need.

`epoch` is the trainer's incarnation: a trainer restarted from a checkpoint may publish a version
number again with other weights, so a replica that synced under another epoch trusts none of its
version numbers and starts from a keyframe. Like every wire message, it carries `v` and a receiver
refuses a version it does not know.

A message on the subject that is not a well-formed announcement (a writer that is not the
trainer, where jobs share NATS credentials) must not stop a replica: `latest` passes over it
to the newest well-formed one, and tells its caller, who dead-letters it once.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Final, Literal

from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from pydantic import Field, ValidationError

from polyrl.api.base import ApiModel
from polyrl.api.naming import JobNames

WIRE_VERSION: Final = 1
# Under LoRA's adapter sync, the frozen base weights as one keyframe, written once per trainer
# life. Not a chain name (`chain.parse`), so never planned over and never pruned.
BASE_OBJECT: Final = "base.key"


class ObjectKind(enum.StrEnum):
    DELTA = "delta"
    KEYFRAME = "keyframe"


class Payload(enum.StrEnum):
    """What the announced object's tensors are."""

    MODEL = "model"  # the model's weights, under the transformers model's names
    ADAPTER = "adapter"  # a LoRA adapter (PEFT's names), served on the base (`BASE_OBJECT`)


class WeightAnnouncement(ApiModel):
    """A weight object of `policy` at `version` is in the policy's bucket, complete."""

    v: Literal[1] = WIRE_VERSION
    policy: str = Field(description="Policy whose weights these are.")
    version: int = Field(ge=0, description="Version a replica holds once the object is applied.")
    epoch: int = Field(ge=0, description="Trainer incarnation; versions of other epochs differ.")
    base_version: int | None = Field(
        None, ge=0, description="Version the delta applies to; null for a keyframe."
    )
    kind: ObjectKind = Field(description="delta or keyframe.")
    object: str = Field(description="Object name in the policy's weights bucket.")
    payload: Payload = Field(
        Payload.MODEL,
        description="model: the weights themselves; adapter: a LoRA adapter, which a "
        "replica serves on the frozen base the trainer wrote once as `BASE_OBJECT`.",
    )
    size: int = Field(ge=0, description="Object size in bytes (its parts' summed).")
    checksum: str = Field(
        description="The object's Object Store digest, 'SHA-256=<base64>'; for an object in "
        "parts, its parts' digests in order, joined by commas."
    )
    parts: int = Field(
        1,
        ge=1,
        le=999,
        description="How many parts the object is stored in: 1, or one per rank of a sharded "
        "trainer, named `<object>.partIIIofNNN` (`chain.part_name`), each that rank's rows "
        "of every tensor.",
    )
    final: bool = Field(
        False,
        description="The trainer's last version: it reached its stop condition and trains no "
        "more, so samples for this policy would be wasted (the workflow runner stops asking).",
    )


def message_id(announcement: WeightAnnouncement) -> str:
    """Nats-Msg-Id: a retried announcement is stored once."""
    a = announcement
    return f"{a.policy}.{a.epoch}.{a.version}.{a.kind}"


async def publish(js: JetStreamContext, names: JobNames, announcement: WeightAnnouncement) -> None:
    await js.publish(
        names.weights_subject(announcement.policy),
        announcement.model_dump_json(by_alias=True).encode(),
        headers={api.Header.MSG_ID: message_id(announcement)},
    )


# Called with a malformed message's stream sequence, its body and why it was refused.
Malformed = Callable[[int, bytes, str], Awaitable[None]]
# How far back `latest` looks past malformed messages (the stream keeps the last 64).
SCAN_BACK = 64


async def latest(
    js: JetStreamContext, names: JobNames, policy: str, *, malformed: Malformed | None = None
) -> WeightAnnouncement | None:
    """The newest well-formed announcement of `policy`, or None if there is none yet;
    each malformed one passed over goes to `malformed`."""
    stream = names.weights_stream(policy)
    try:
        msg = await js.get_last_msg(stream, names.weights_subject(policy))
    except NotFoundError:
        return None
    for _ in range(SCAN_BACK):
        try:
            return WeightAnnouncement.model_validate_json(msg.data or b"")
        except ValidationError as err:
            if malformed is not None:
                await malformed(msg.seq or 0, msg.data or b"", f"malformed announcement: {err}")
        if not msg.seq or msg.seq <= 1:
            return None
        try:
            msg = await js.get_msg(stream, msg.seq - 1)
        except NotFoundError:  # older ones are gone: nothing well-formed within reach
            return None
    return None
