"""Dataset tasks: files in verl, TRL, OpenRLHF and plain formats, read with `datasets`, their
held-out splits, bad data named by file, row and column, and rewards in three signatures."""

from __future__ import annotations

import importlib.util
import json
import logging
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.unit.workers import rewardfns

from polyrl.api import taskparams
from polyrl.api.launch import DATA_ROOT_ENV, PVC_ROOT_ENV
from polyrl.workers.tasks import base, dataset, rewards

REPO = Path(__file__).resolve().parents[3]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("math_dataset", REPO / "examples/math_dataset.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["math_dataset"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def math_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("math")
    _example().write(out, train=300, test=40)
    return out


def task(**params: Any) -> dataset.DatasetTask:
    return dataset.make(params, held_out=20, seed=0)


@pytest.mark.slow  # writes the example's files and imports datasets first: 5-17 s
def test_the_verl_and_trl_files_of_the_example_load_to_the_same_problems(math_data: Path) -> None:
    verl = task(path=str(math_data / "train.parquet"), heldOutPath=str(math_data / "test.parquet"))
    trl = task(
        path=str(math_data / "train.jsonl"), heldOutPath=str(math_data / "test.jsonl"), format="trl"
    )
    assert verl.format == "verl"
    for index in (0, 7, 299):
        a, b = verl.problem(index), trl.problem(index)
        assert (a.id, a.answer, a.messages) == (b.id, b.answer, b.messages)
    assert [p.id for p in verl.held_out()] == [p.id for p in trl.held_out()]
    problem = verl.problem(3)
    assert problem.messages is not None
    assert problem.messages[0]["role"] == "system"
    assert problem.request == list(problem.messages)
    assert problem.meta is not None
    assert problem.meta["data_source"] == "polyrl/math-words"


def test_the_format_is_detected_from_the_columns_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows: dict[str, list[dict[str, Any]]] = {
        "openrlhf": [{"input": "1+1=", "label": "2"}],
        "trl": [{"prompt": "1+1=", "solution": "2", "level": 1}],
    }
    for fmt, data in rows.items():
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in data * 40))
        with caplog.at_level(logging.INFO, logger="polyrl.dataset"):
            loaded = task(path=str(path), heldOutFraction=0.1)
        assert loaded.format == fmt
        assert f"format detected as {fmt}" in caplog.text
        assert loaded.problem(0).answer == "2"


def test_a_seeded_held_out_fraction_is_fixed_and_never_sampled(math_data: Path) -> None:
    path = str(math_data / "train.parquet")
    one, two = task(path=path, heldOutFraction=0.1), task(path=path, heldOutFraction=0.1)
    held = {p.id for p in one.held_out()}
    assert len(held) == 20
    assert held == {p.id for p in two.held_out()}
    rng = random.Random(0)
    assert not held & {one.sample(rng).id for _ in range(500)}


def test_a_held_out_file_sharing_a_prompt_with_training_is_refused(math_data: Path) -> None:
    with pytest.raises(dataset.DataError, match="shares a prompt with training row"):
        task(path=str(math_data / "train.parquet"), heldOutPath=str(math_data / "train.parquet"))


def _parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.mark.parametrize(
    ("rows", "params", "message"),
    [
        (None, {}, "no such file"),
        ([{"prompt": "1+1=", "answer": "2"}], {"promptKey": "question"}, "no column 'question'"),
        ([{"prompt": "1+1=", "answer": "2"}], {"path": "x.csv"}, "expected .parquet"),
        (
            [{"prompt": "1+1=", "answer": "2"}] * 30 + [{"prompt": "", "answer": "3"}],
            {"heldOutPath": "SELF"},
            "row 30: column 'prompt' is neither text nor chat messages",
        ),
        (
            [{"prompt": "1+1=", "answer": "2"}],
            {"format": "csv"},
            r"params\.format must be one of verl, trl, openrlhf, plain \(got 'csv'\)",
        ),
        ([{"prompt": "1+1=", "answer": "2"}], {"reward": "nosuchmodule:f"}, "cannot import"),
    ],
)
def test_bad_data_is_a_clear_error_naming_the_file_row_and_column(
    tmp_path: Path, rows: list[dict[str, Any]] | None, params: dict[str, Any], message: str
) -> None:
    path = (
        str(tmp_path / "data.parquet") if rows is None else _parquet(tmp_path / "d.parquet", rows)
    )
    params = {"path": path, "format": "plain", **params}
    if params.get("heldOutPath") == "SELF":
        params["heldOutPath"] = _parquet(tmp_path / "held.parquet", rows or [])
        params["path"] = _parquet(tmp_path / "train.parquet", [{"prompt": "9+9=", "answer": "18"}])
    if params["path"] == "x.csv":
        (tmp_path / "x.csv").write_text("prompt,answer\n")
        params["path"] = str(tmp_path / "x.csv")
    with pytest.raises(ValueError, match=message):
        dataset.make(params, held_out=40, seed=0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"promptkey": "q"}, r"reads only the params .* \(unknown: promptkey\)"),
        ({"heldOutPath": "t.parquet", "heldOutFraction": 0.1}, "exclude each other"),
        ({"heldOutFraction": 3}, r"params\.heldOutFraction must be at least 0 and below 1"),
        ({"rewardTimeout": True}, r"params\.rewardTimeout must be a number \(got True\)"),
    ],
    ids=["unknown-key", "two-held-out-sources", "fraction-above-1", "bool-timeout"],
)
def test_params_the_api_refuses_are_refused_before_any_file_is_opened(
    tmp_path: Path, params: dict[str, Any], message: str
) -> None:
    # The same declarations as the API server's rules (polyrl.api.taskparams); the file
    # does not exist, so an error about it would mean the params were not checked first.
    with pytest.raises(ValueError, match=f"^task dataset: .*{message}"):
        dataset.make({"path": str(tmp_path / "absent.parquet"), **params}, held_out=4, seed=0)


def test_the_worker_reads_the_declarations_the_api_checks() -> None:
    assert (dataset.NAME, dataset.FORMATS) == (taskparams.NAME, taskparams.FORMATS)
    assert rewards.STYLES == taskparams.REWARD_STYLES


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(dataset.DataError, match=r"empty\.jsonl"):
        task(path=str(tmp_path / "empty.jsonl"), format="plain")


PROBLEM = base.Problem(
    "What is 6*7?",
    "42",
    "p1",
    meta={"data_source": "polyrl/math-words", "extra_info": {"index": 1}, "level": 3},
)


def test_math_rewards_read_the_boxed_answer_and_exact_the_first_line() -> None:
    math = rewards.make("math")
    assert math(PROBLEM, "6*7=42, so \\boxed{42}") == 1.0
    assert math(PROBLEM, "\\boxed{41}") == 0.0
    assert math(PROBLEM, "The answer is 42.") == 1.0
    assert rewards.make("exact")(PROBLEM, "42\nmore") == 1.0
    assert math(base.Problem("q", "x^2+1", "p3"), "\\boxed{x^2+1}") == 1.0
    unreadable = base.Problem("q", "no number here", "p2")
    assert math(unreadable, "\\boxed{1}") == 0.0
    assert isinstance(math, rewards.MathReward)
    assert math.unparsable == {"p2"}


def test_user_rewards_are_called_in_their_own_signature() -> None:
    verl = rewards.make("tests.unit.workers.rewardfns:verl_score")
    assert verl(PROBLEM, "so 42") == 1.0  # a dict's score, routed by data_source
    assert rewardfns.SEEN["verl"] == ("polyrl/math-words", {"index": 1})
    assert rewards.make("tests.unit.workers.rewardfns:verl_async")(PROBLEM, "x") == 0.5
    trl = rewards.make("tests.unit.workers.rewardfns:trl_reward")
    assert trl(PROBLEM, "abc") == 3.0
    assert rewardfns.SEEN["trl"] == ["data_source", "extra_info", "level"]  # columns reach it
    openrlhf = rewards.make("tests.unit.workers.rewardfns:openrlhf_reward")
    assert openrlhf(PROBLEM, " 42") == 1.0
    assert rewardfns.SEEN["openrlhf"] == (["What is 6*7? 42"], ["What is 6*7?"], ["42"])


@pytest.mark.parametrize(
    ("function", "completion", "message"),
    [
        ("raises", "x", "raised KeyError"),
        ("text", "x", "returned 'good', not a number"),
        ("trl_reward", "n/a", "not applicable"),
    ],
)
def test_a_failing_reward_fails_that_sample_only_with_the_cause(
    function: str, completion: str, message: str
) -> None:
    reward = rewards.make(f"tests.unit.workers.rewardfns:{function}")
    with pytest.raises(rewards.RewardFailed, match=message):
        reward(PROBLEM, completion)


def test_a_slow_reward_times_out() -> None:
    reward = rewards.make("tests.unit.workers.rewardfns:slow", timeout=0.2)
    with pytest.raises(rewards.RewardFailed, match=r"timed out after 0\.2 s"):
        reward(PROBLEM, "x")


def test_a_function_of_no_known_signature_needs_its_style_named() -> None:
    with pytest.raises(ValueError, match="matches no known signature"):
        rewards.make("tests.unit.workers.rewardfns:unknown")
    with pytest.raises(ValueError, match="rewardStyle 'grpo'"):
        rewards.make("tests.unit.workers.rewardfns:unknown", style="grpo")


def test_a_pvc_data_path_reads_where_the_operator_mounts_its_claim(
    math_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the operator the claim is mounted at PVC_ROOT/<claim>; the test moves the root."""
    (tmp_path / "math-data").symlink_to(math_data)
    monkeypatch.setenv(PVC_ROOT_ENV, str(tmp_path))
    mounted = task(path="pvc://math-data/train.parquet", heldOutPath="pvc://math-data/test.parquet")
    local = task(path=str(math_data / "train.parquet"), heldOutPath=str(math_data / "test.parquet"))
    assert mounted.problem(5).id == local.problem(5).id
    assert [p.id for p in mounted.held_out()] == [p.id for p in local.held_out()]
    with pytest.raises(
        dataset.DataError, match=r"claim 'other' is not mounted at .*on one machine"
    ):
        task(path="pvc://other/train.parquet")
    with pytest.raises(dataset.DataError, match=r"expected pvc://<claim>/<path inside the claim>"):
        task(path="pvc://math-data")


def test_configmap_and_secret_data_paths_read_where_the_operator_mounts_them(
    math_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ConfigMap is mounted at /mnt/polyrl/configmap/<name>, a Secret at
    /mnt/polyrl/secret/<name>, each key a file; the test moves the root."""
    (tmp_path / "configmap").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "configmap" / "math-small").symlink_to(math_data)
    (tmp_path / "secret" / "held").symlink_to(math_data)
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path))
    mounted = task(
        path="configmap://math-small/train.parquet", heldOutPath="secret://held/test.parquet"
    )
    local = task(path=str(math_data / "train.parquet"), heldOutPath=str(math_data / "test.parquet"))
    assert mounted.problem(5).id == local.problem(5).id
    assert [p.id for p in mounted.held_out()] == [p.id for p in local.held_out()]
    with pytest.raises(dataset.DataError, match=r"configmap 'other' is not mounted at .*operator"):
        task(path="configmap://other/train.parquet")
    with pytest.raises(dataset.DataError, match=r"expected secret://<name>/<key>"):
        task(path="secret://held")
