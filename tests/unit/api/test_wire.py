"""The wire models refuse what the trainer must never compute with."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from polyrl.api.wire import Completion, Trajectory

TRAJECTORY = {
    "id": "t",
    "episode_id": "e",
    "group_id": "g",
    "policy": "solver",
    "prompt_tokens": [1],
    "tokens": [2, 3],
    "logprobs": [-0.5, -1.0],
    "reward": 1.0,
    "weight_version": 0,
    "created_at": 0.0,
}


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["reward", "logprobs"])
def test_a_non_finite_reward_or_log_prob_is_refused(field: str, value: str) -> None:
    doc = json.dumps(TRAJECTORY | {field: "@"}).replace(
        '"@"', value if field == "reward" else f"[{value}, -1.0]"
    )
    with pytest.raises(ValidationError, match="finite number"):
        Trajectory.model_validate_json(doc)


def test_a_completion_with_a_non_finite_log_prob_is_refused() -> None:
    doc = '{"tokens": [1], "logprobs": [NaN], "text": "x", "finish_reason": "stop"}'
    with pytest.raises(ValidationError, match="finite number"):
        Completion.model_validate_json(doc)


def test_finite_values_pass() -> None:
    assert Trajectory.model_validate_json(json.dumps(TRAJECTORY)).reward == 1.0


def test_a_version_2_trajectory_is_still_read_with_its_finish_reason_unknown() -> None:
    old = Trajectory.model_validate_json(json.dumps(TRAJECTORY | {"v": 2}))
    assert old.finish_reason is None
    new = Trajectory.model_validate_json(json.dumps(TRAJECTORY | {"finish_reason": "length"}))
    assert (new.v, new.finish_reason) == (3, "length")
    with pytest.raises(ValidationError):
        Trajectory.model_validate_json(json.dumps(TRAJECTORY | {"v": 4}))
