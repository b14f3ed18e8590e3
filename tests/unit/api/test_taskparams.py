"""A dataset task's params are refused by the models as by the API server, naming the param;
other tasks' params stay free-form; the CEL rules and the Python checks are one declaration
(polyrl.api.taskparams)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from polyrl.api import crds, taskparams
from polyrl.api.resources import TaskSpec


def refusal(name: str, params: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        TaskSpec(name=name, params=params)
    return str(caught.value)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"path": "t.parquet", "format": "parket"}, "params.format must be one of verl, trl, "),
        ({"format": "verl"}, "a dataset task needs params.path (the data file)"),
        ({"path": "t.parquet", "heldOutFraction": 3}, "params.heldOutFraction must be at least 0"),
        ({"path": "t.parquet", "heldOutFraction": -0.1}, "params.heldOutFraction must be at"),
        ({"path": "t.parquet", "heldOutFraction": 1.0}, "params.heldOutFraction must be at"),
        (
            {"path": "t.parquet", "heldOutPath": "h.parquet", "heldOutFraction": 0.1},
            "params.heldOutPath and params.heldOutFraction exclude each other",
        ),
        ({"path": "t.parquet", "promptkey": "q"}, "(unknown: promptkey)"),
        ({"path": "t.parquet", "rewardStyle": "foo"}, "params.rewardStyle must be one of verl"),
        ({"path": "t.parquet", "rewardTimeout": -1}, "params.rewardTimeout must be a number of"),
        ({"path": "t.parquet", "rewardTimeout": 0}, "params.rewardTimeout must be a number of"),
        ({"path": ""}, "params.path must be non-empty text (got '')"),
        ({"path": 5}, "params.path must be non-empty text (got 5)"),
        ({"path": "t.parquet", "format": 3}, "params.format must be one of"),
        ({"path": "t.parquet", "promptKey": ""}, "params.promptKey must be non-empty text"),
        ({"path": "t.parquet", "reward": ""}, "params.reward must be non-empty text"),
        ({"path": True}, "params.path must be text or an integer (got True)"),
        (
            {"path": "t.parquet", "heldOutFraction": "0.1"},
            "params.heldOutFraction must be a number",
        ),
        ({"path": "t.parquet", "rewardTimeout": True}, "params.rewardTimeout must be a number"),
    ],
    ids=[
        "format-misspelt",
        "no-path",
        "fraction-3",
        "fraction-negative",
        "fraction-1",
        "two-held-out-sources",
        "unknown-key",
        "unknown-reward-style",
        "negative-timeout",
        "zero-timeout",
        "empty-path",
        "integer-path",
        "integer-format",
        "empty-prompt-key",
        "empty-reward",
        "bool-path",
        "text-fraction",
        "bool-timeout",
    ],
)
def test_a_bad_dataset_param_is_refused_naming_it(params: dict[str, Any], message: str) -> None:
    said = refusal("dataset", params)
    assert message in said, said


@pytest.mark.parametrize(
    "params",
    [
        {"path": "data/math/train.parquet", "heldOutPath": "data/math/test.parquet"},
        {
            "path": "pvc://data/train.jsonl",
            "format": "trl",
            "promptKey": "question",
            "answerKey": "reward_model.ground_truth",
            "heldOutFraction": 0,
            "reward": "my_rewards:score",
            "rewardStyle": "verl",
            "rewardTimeout": 0.5,
        },
        {"path": "t.parquet", "heldOutFraction": 0.999, "rewardTimeout": 30, "reward": "math"},
    ],
    ids=["example", "every-param", "bounds"],
)
def test_good_dataset_params_are_accepted(params: dict[str, Any]) -> None:
    assert TaskSpec(name="dataset", params=params).params == params


def test_other_tasks_take_any_key_and_only_the_dataset_keys_keep_their_types() -> None:
    free = {"digits": 2, "ratio": 0.5, "reverse": True, "format": 3, "heldOutFraction": 7}
    assert TaskSpec(name="my_tasks:make", params=free).params == free
    assert TaskSpec(name="arithmetic", params={"path": 5}).params == {"path": 5}
    said = refusal("my_tasks:make", {"reward": 0.5})
    assert "params.reward must be text or an integer (got 0.5)" in said
    assert "params.rewardTimeout must be a number" in refusal("countdown", {"rewardTimeout": "x"})


def test_every_rule_is_a_cel_rule_with_the_same_message_on_its_field() -> None:
    schema = crds.rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    task = schema["properties"]["spec"]["properties"]["workflow"]["properties"]["task"]
    rules = task["x-kubernetes-validations"]
    assert [r["message"] for r in rules] == [r.message for r in taskparams.RULES]
    for rule, cel in zip(taskparams.RULES, rules, strict=True):
        assert cel["rule"].startswith("self.name != 'dataset' || ")
        assert cel["fieldPath"] == ".params" + (f".{rule.field}" if rule.field else "")
    params = task["properties"]["params"]
    assert set(taskparams.KNOWN) == set(taskparams.TEXT) | set(taskparams.NUMBERS)
    assert list(params["properties"]) == list(taskparams.KNOWN)
    assert params["x-kubernetes-preserve-unknown-fields"] is True
    assert "additionalProperties" not in params


@pytest.mark.parametrize(
    ("value", "kind"), [([1, 2], "a list"), ({"a": 1}, "an object"), (None, "null")]
)
def test_a_param_that_is_no_scalar_is_one_error_naming_it(value: Any, kind: str) -> None:
    # The API server keeps a task's own keys as given; the models refuse what is no scalar.
    with pytest.raises(ValidationError) as caught:
        TaskSpec(name="arithmetic", params={"digits": value})
    (error,) = caught.value.errors()
    assert error["loc"] == ("params", "digits")
    assert f"a task param is a number, text or a boolean, not {kind}" in error["msg"]
