"""Mutated messages for the fuzz tests: what a buggy or hostile publisher could put on a subject.

Each strategy starts from one valid message (a dict as the wire model dumps it) and breaks it
one way: cut short, a field of the wrong type, a field missing, an unknown field, a wrong
schema version, a non-finite number, an oversized body, bytes that are not JSON, JSON that is
not an object. Whether a mutant is malformed is decided by the wire model itself
(`malformed`): the workers must dead-letter exactly those and serve or ignore the rest.

`examples` draws a list of them with hypothesis (derandomised, so a failure reproduces); how
many is `count` times `POLYRL_FUZZ_SCALE` (1 in `make test`, 5 under `make test-fuzz`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

OVERSIZED = 600_000  # bytes: below NATS's default 1 MiB payload limit, far above any message
WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # allow_nan: NaN and Infinity go out as JS literals


def mutants(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """One broken variant of `valid` per draw."""
    text = _dumps(valid)
    keys = sorted(valid)
    numbers = [k for k in keys if isinstance(valid[k], float)]
    return st.one_of(
        st.integers(min_value=0, max_value=len(text) - 1).map(lambda n: text[:n]),
        st.tuples(st.sampled_from(keys), WRONG_VALUES).map(
            lambda kv: _dumps({**valid, kv[0]: kv[1]})
        ),
        st.sampled_from(keys).map(lambda k: _dumps({x: v for x, v in valid.items() if x != k})),
        st.text(min_size=1, max_size=8)
        .filter(lambda k: k not in valid)
        .map(lambda k: _dumps({**valid, k: 1})),
        st.integers()
        .filter(lambda v: v != valid.get("v"))
        .map(lambda v: _dumps({**valid, "v": v})),
        st.tuples(
            st.sampled_from(numbers or keys), st.sampled_from([float("nan"), float("inf")])
        ).map(lambda kv: _dumps({**valid, kv[0]: kv[1]})),
        st.just(_dumps({**valid, "padding": "x" * OVERSIZED})),
        st.binary(min_size=1, max_size=64),
        st.sampled_from([b"", b"null", b"[]", b"42", b'"text"', b"true", b"{}"]),
    )


def examples(strategy: st.SearchStrategy[bytes], count: int) -> list[bytes]:
    """`count` × POLYRL_FUZZ_SCALE draws of `strategy`, the same on every run."""
    drawn: list[bytes] = []
    wanted = count * int(os.environ.get("POLYRL_FUZZ_SCALE", "1"))

    @settings(
        max_examples=wanted,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def draw(message: bytes) -> None:
        drawn.append(message)

    draw()
    return drawn[:wanted]


def malformed(model: type[BaseModel], message: bytes) -> bool:
    """Whether the wire model refuses `message` (what a worker must dead-letter)."""
    try:
        model.model_validate_json(message)
    except ValidationError:
        return True
    return False
