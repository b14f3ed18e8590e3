"""The weight announcement on the wire: camelCase JSON, versioned, strict."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from polyrl.workers.weightsync.announce import ObjectKind, WeightAnnouncement, message_id


def announcement(**changes: object) -> WeightAnnouncement:
    fields: dict[str, object] = {
        "policy": "solver",
        "version": 12,
        "epoch": 0,
        "base_version": 11,
        "kind": ObjectKind.DELTA,
        "object": "v000000000012.delta.from000000000011",
        "size": 4321,
        "checksum": "SHA-256=abc=",
    }
    return WeightAnnouncement.model_validate({**fields, **changes})


def test_an_announcement_round_trips_as_camel_case_json_with_its_wire_version() -> None:
    wire = json.loads(announcement().model_dump_json(by_alias=True))
    assert wire["v"] == 1
    assert wire["baseVersion"] == 11
    assert wire["kind"] == "delta"
    assert WeightAnnouncement.model_validate(wire) == announcement()


def test_a_keyframe_has_no_base_version() -> None:
    key = announcement(kind="keyframe", base_version=None, object="v000000000010.key")
    assert key.base_version is None
    assert message_id(key) == "solver.0.12.keyframe"
    assert message_id(key) != message_id(announcement())


@pytest.mark.parametrize(
    "change",
    [{"v": 2}, {"kind": "snapshot"}, {"version": -1}, {"surprise": True}],
    ids=["unknown wire version", "unknown kind", "negative version", "unknown field"],
)
def test_a_receiver_refuses_what_it_does_not_know(change: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        announcement(**change)
