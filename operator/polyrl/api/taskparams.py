"""The `dataset` task's params, declared once: for the API server (schema and CEL rules), for
the models the operator and `polyrl run` parse jobs with, and for the worker that reads them.

`TaskSpec.params` is flat and free-form, because every task takes its own keys (`digits` for
`arithmetic`, anything for a user's `module:function`). CEL sees only values the schema
types: a map of untyped values, or an object that only preserves unknown fields, is invisible
to it, and a map of `x-kubernetes-int-or-string` values (which CEL could list) makes the API
server refuse every float and boolean. So `params` declares the nine dataset keys as typed
properties and keeps every other key as it is (`x-kubernetes-preserve-unknown-fields`). The
types hold for every task: a key called `path` is text or an integer, `heldOutFraction` a
number, whatever the task. The dataset's own rules (a required `path`, its formats and reward
styles, the ranges, no unknown key) hold only when `task.name` is `dataset`; each is written
here twice, side by side, as a CEL rule and as a Python check, with one message.

CEL cannot list the keys the schema does not declare, so it counts them (`size(dyn(params))`
against the declared keys present), and its message lists what a dataset task accepts; the
Python check also names the unknown key. Text values are `dyn` to CEL (int-or-string, so other
tasks may give an integer under these names) and CEL's cost estimate for a `dyn` string is
unbounded: text is compared with constants and measured with `size()`, never matched against
a pattern or quoted in a message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic.config import JsonDict, JsonValue

NAME = "dataset"
FORMATS = ("verl", "trl", "openrlhf", "plain")
REWARD_STYLES = ("verl", "trl", "openrlhf")
DEFAULT_HELD_OUT_FRACTION = 0.05
DEFAULT_REWARD_TIMEOUT = 10.0

Value = int | float | str | bool
Params = Mapping[str, Value]


def _scalar(value: Any) -> Any:
    """One message for a value that is no scalar (the API server keeps a task's own keys as
    given, lists and objects too), instead of one per member of the union."""
    if value is None or isinstance(value, list | dict):
        kind = "null" if value is None else "a list" if isinstance(value, list) else "an object"
        raise ValueError(f"a task param is a number, text or a boolean, not {kind}")
    return value


Param = Annotated[Value, BeforeValidator(_scalar)]  # what TaskSpec.params holds

# Each key's meaning, as `kubectl explain` shows it (docs/datasets.md has the long form).
TEXT: dict[str, str] = {
    "path": "dataset: the training file (parquet, jsonl, json or arrow; pvc://, configmap:// "
    "or secret:// on a cluster).",
    "format": f"dataset: {', '.join(FORMATS)}; detected from the columns when absent.",
    "promptKey": "dataset: the prompt's column (`a.b`: field b of struct column a).",
    "answerKey": "dataset: the answer's column (`a.b`: field b of struct column a).",
    "heldOutPath": "dataset: a separate held-out file of the same format.",
    "reward": "dataset: exact, math or a `module:function`.",
    "rewardStyle": f"dataset: {', '.join(REWARD_STYLES)}; detected from the function when absent.",
}
NUMBERS: dict[str, str] = {
    "heldOutFraction": "dataset, without heldOutPath: the fraction of the rows held out "
    f"(at least 0, below 1; default {DEFAULT_HELD_OUT_FRACTION}).",
    "rewardTimeout": "dataset: seconds a reward may take for one sample (above 0; default "
    f"{DEFAULT_REWARD_TIMEOUT:g}).",
}
KNOWN = (
    "path", "format", "promptKey", "answerKey", "heldOutPath", "heldOutFraction", "reward",
    "rewardStyle", "rewardTimeout",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Rule:
    """One check of a dataset task's params, as CEL over the TaskSpec and as Python."""

    field: str  # the param it concerns; "" for params as a whole
    cel: str  # holds when the params are right
    message: str
    holds: Callable[[Params], bool]
    got: Callable[[Params], str] = lambda params: ""  # what Python adds to the message
    reason: str = "FieldValueInvalid"


P = "self.params"  # in the CEL rules, which the TaskSpec carries


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _absent_or(key: str, test: Callable[[Any], bool]) -> Callable[[Params], bool]:
    return lambda params: key not in params or test(params[key])


def _value(key: str) -> Callable[[Params], str]:
    return lambda params: f" (got {params[key]!r})"


def _text_rule(key: str) -> Rule:
    return Rule(
        key,
        f"!has({P}.{key}) || type({P}.{key}) == string && size({P}.{key}) > 0",
        f"params.{key} must be non-empty text",
        _absent_or(key, _is_text),
        _value(key),
    )


def _choice_rule(key: str, choices: tuple[str, ...]) -> Rule:
    listed = ", ".join(f"'{c}'" for c in choices)
    return Rule(
        key,
        f"!has({P}.{key}) || {P}.{key} in [{listed}]",
        f"params.{key} must be one of {', '.join(choices)}",
        _absent_or(key, lambda v: isinstance(v, str) and v in choices),
        _value(key),
    )


def _known_present() -> str:
    return "[" + ", ".join(f"has({P}.{k})" for k in KNOWN) + "].filter(x, x).size()"


RULES: tuple[Rule, ...] = (
    Rule(
        "path",
        f"has({P}.path)",
        "a dataset task needs params.path (the data file)",
        lambda params: "path" in params,
        reason="FieldValueRequired",
    ),
    Rule(
        "",
        f"size(dyn({P})) == {_known_present()}",
        f"a dataset task reads only the params {', '.join(KNOWN)}",
        lambda params: set(params) <= set(KNOWN),
        lambda params: f" (unknown: {', '.join(sorted(set(params) - set(KNOWN)))})",
    ),
    Rule(
        "",
        f"!(has({P}.heldOutPath) && has({P}.heldOutFraction))",
        "params.heldOutPath and params.heldOutFraction exclude each other: the held-out "
        "problems come from a file or from a fraction of the training rows",
        lambda params: not ("heldOutPath" in params and "heldOutFraction" in params),
    ),
    *(_text_rule(key) for key in ("path", "promptKey", "answerKey", "heldOutPath", "reward")),
    _choice_rule("format", FORMATS),
    _choice_rule("rewardStyle", REWARD_STYLES),
    Rule(
        "heldOutFraction",
        f"!has({P}.heldOutFraction) || {P}.heldOutFraction >= 0.0 && {P}.heldOutFraction < 1.0",
        "params.heldOutFraction must be at least 0 and below 1",
        _absent_or("heldOutFraction", lambda v: _is_number(v) and 0 <= v < 1),
        _value("heldOutFraction"),
    ),
    Rule(
        "rewardTimeout",
        f"!has({P}.rewardTimeout) || {P}.rewardTimeout > 0.0",
        "params.rewardTimeout must be a number of seconds above 0",
        _absent_or("rewardTimeout", lambda v: _is_number(v) and v > 0),
        _value("rewardTimeout"),
    ),
)


def schema() -> dict[str, Any]:
    """The JSON schema of `TaskSpec.params`: the dataset keys typed, every other key kept."""
    properties = {
        key: {"x-kubernetes-int-or-string": True, "description": TEXT[key]}
        if key in TEXT
        else {"type": "number", "description": NUMBERS[key]}
        for key in KNOWN
    }
    return {
        "type": "object",
        "properties": properties,
        "x-kubernetes-preserve-unknown-fields": True,
    }


def cel_rules() -> JsonDict:
    """The TaskSpec's `x-kubernetes-validations`: the dataset rules, for a dataset task only."""
    rules: list[JsonValue] = [
        {
            "rule": f"self.name != '{NAME}' || {rule.cel}",
            "message": rule.message,
            "fieldPath": ".params" + (f".{rule.field}" if rule.field else ""),
            "reason": rule.reason,
        }
        for rule in RULES
    ]
    return {"x-kubernetes-validations": rules}


def typing_problems(params: Params) -> list[str]:
    """What the API server's types refuse in any task's params (the dataset keys' types)."""
    found = []
    for key, value in params.items():
        if key in TEXT and (isinstance(value, bool) or not isinstance(value, str | int)):
            found.append(f"params.{key} must be text or an integer (got {value!r})")
        elif key in NUMBERS and not _is_number(value):
            found.append(f"params.{key} must be a number (got {value!r})")
    return found


def dataset_problems(params: Params) -> list[str]:
    """What a dataset task's params break, one message per rule (as the API server says)."""
    return [rule.message + rule.got(params) for rule in RULES if not rule.holds(params)]


def problems(task: str, params: Params) -> list[str]:
    """Everything wrong with a task's params that the API server also refuses."""
    found = typing_problems(params)
    return found + (dataset_problems(params) if task == NAME and not found else [])
