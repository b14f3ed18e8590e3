"""`dataset`: problems from a file in verl, TRL, OpenRLHF or plain format, read with `datasets`.

Params (flat, as every task's): `path` (parquet, jsonl, json or arrow), `format` (`verl`,
`trl`, `openrlhf`, `plain`; detected from the columns when absent, and the log says which),
`promptKey` / `answerKey` (override the format's columns), `heldOutPath` (a separate file of
the same format; else `heldOutFraction`, default 0.05, of the rows, drawn with the task's
seed), `reward` (`exact`, `math` or `module:function`), `rewardStyle` (`verl`, `trl`,
`openrlhf`; detected from the function's signature when absent) and `rewardTimeout` (seconds,
default 10). What each may be is declared in `polyrl.api.taskparams`, which the API server's
rules come from too; `make` checks the same before it opens a file.

| format | prompt | answer | other columns reach rewards as |
|---|---|---|---|
| verl | `prompt` (chat messages) | `reward_model.ground_truth` | `data_source`, `extra_info` |
| trl | `prompt` (text or messages) | `answer`, `solution` or `ground_truth` | keyword columns |
| openrlhf | `input` | `label` | - |
| plain | `prompt` | `answer` | - |

The file is opened as memory-mapped Arrow (`datasets` converts parquet and json into its
cache once; an arrow file is mapped where it lies), so a worker holds a row only while it
uses it: sampling draws a row index and reads that row. The held-out problems are fixed for
the whole job and never sampled for training; a separate held-out file that shares a prompt
with the training file is refused.
"""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polyrl.api import taskparams
from polyrl.workers.models.sources import resolve_data
from polyrl.workers.tasks import base, rewards

NAME = taskparams.NAME
FORMATS = taskparams.FORMATS
_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
_KEYS = {
    "verl": ("prompt", "reward_model.ground_truth"),
    "trl": ("prompt", None),  # the answer: the first of _TRL_ANSWERS present
    "openrlhf": ("input", "label"),
    "plain": ("prompt", "answer"),
}
_TRL_ANSWERS = ("answer", "solution", "ground_truth")
_BATCH = 10_000
log = logging.getLogger("polyrl.dataset")


class DataError(ValueError):
    """A data file the task cannot use; the message names the file, row and column."""


def open_file(path: str) -> Any:
    """The file as a memory-mapped `datasets.Dataset` (its one split)."""
    import datasets
    import pyarrow

    # Arrow's default pool (mimalloc) keeps what the conversion freed: a million-row parquet
    # left about 150 MB more resident in every worker. The system allocator gives it back.
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    try:  # pvc://, configmap://, secret://: where the operator mounted the volume
        file = resolve_data(path)
    except ValueError as err:
        raise DataError(str(err)) from None
    if not file.is_file():
        raise DataError(f"dataset {path!r}: no such file")
    builder = _BUILDERS.get(file.suffix)
    if builder is None:
        raise DataError(f"dataset {path!r}: expected {', '.join(_BUILDERS)} (by extension)")
    datasets.disable_progress_bars()
    try:
        if builder == "arrow":
            data = datasets.Dataset.from_file(str(file))  # mapped where it lies
        else:
            # Converted into the cache in batches of 10k rows, so a large file never passes
            # through memory whole (1M rows: about 170 MB at the peak, once per cache).
            batches = {"batch_size": _BATCH} if builder == "parquet" else {}
            data = datasets.load_dataset(
                builder,
                data_files=str(file),
                split="train",
                writer_batch_size=_BATCH,
                cache_dir=cache_dir(),
                **batches,
            )
    except Exception as err:  # datasets raises many kinds for a file it cannot read
        raise DataError(f"dataset {path!r}: cannot read it: {err}") from None
    if len(data) == 0:
        raise DataError(f"dataset {path!r}: no rows")
    return data


def cache_dir() -> str:
    """Where `datasets` keeps its converted copy: HF_DATASETS_CACHE, else under the temporary
    directory (a worker pod's only writable place besides its claims)."""
    return os.environ.get("HF_DATASETS_CACHE") or str(
        Path(tempfile.gettempdir()) / "polyrl-datasets"
    )


def detect_format(columns: list[str]) -> str:
    if "reward_model" in columns and "prompt" in columns:
        return "verl"
    if "input" in columns:
        return "openrlhf"
    if "prompt" in columns and any(c in columns for c in _TRL_ANSWERS):
        return "trl"
    raise DataError(
        f"cannot tell the dataset's format from its columns {columns}: set format "
        f"({', '.join(FORMATS)}) and promptKey/answerKey"
    )


def _get(row: Mapping[str, Any], key: str) -> Any:
    """A column, or a field of a struct column (`reward_model.ground_truth`)."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


class DatasetTask:
    def __init__(
        self,
        data: Any,
        *,
        source: str,
        fmt: str,
        prompt_key: str,
        answer_key: str,
        reward: rewards.Reward,
        held_out: list[base.Problem],
        excluded: frozenset[int] = frozenset(),
    ) -> None:
        self.data, self.source, self.format = data, source, fmt
        self.prompt_key, self.answer_key, self._reward = prompt_key, answer_key, reward
        self._held_out, self._excluded = held_out, excluded
        if len(excluded) >= len(data):
            raise DataError(f"dataset {source!r}: every row is held out; nothing to train on")

    @property
    def name(self) -> str:
        return NAME

    def problem(self, index: int, data: Any = None, source: str | None = None) -> base.Problem:
        """Row `index` as a problem; DataError naming the file, row and column if it is not one."""
        row = (self.data if data is None else data)[index]
        where = f"dataset {source or self.source!r} row {index}"
        prompt = _get(row, self.prompt_key)
        answer = _get(row, self.answer_key)
        if answer is None:
            raise DataError(f"{where}: no answer in column {self.answer_key!r}")
        meta = {k: v for k, v in row.items() if k != self.prompt_key}
        if isinstance(prompt, str) and prompt:
            return base.Problem(prompt, str(answer), base.problem_id(NAME, prompt), meta=meta)
        messages = _messages(prompt)
        if messages:
            key = json.dumps(messages, sort_keys=True)
            text = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
            return base.Problem(
                text, str(answer), base.problem_id(NAME, key), messages=messages, meta=meta
            )
        raise DataError(
            f"{where}: column {self.prompt_key!r} is neither text nor chat messages "
            f"({{'role', 'content'}}): {str(prompt)[:80]!r}"
        )

    def sample(self, rng: random.Random) -> base.Problem:
        for _ in range(base.MAX_SAMPLE_ATTEMPTS):
            index = rng.randrange(len(self.data))
            if index not in self._excluded:
                return self.problem(index)
        raise RuntimeError(f"dataset {self.source!r}: no training row found")

    def reward(self, problem: base.Problem, completion: str) -> float:
        return self._reward(problem, completion)

    def held_out(self) -> list[base.Problem]:
        return list(self._held_out)


def _is_message(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and isinstance(value.get("role"), str)
        and (isinstance(value.get("content"), str))
    )


def _keys(params: base.Params, fmt: str, columns: list[str], path: str) -> tuple[str, str]:
    prompt_key, answer_key = _KEYS[fmt]
    prompt_key = str(params.get("promptKey", prompt_key))
    if "answerKey" in params:
        answer_key = str(params["answerKey"])
    elif answer_key is None:
        answer_key = next((c for c in _TRL_ANSWERS if c in columns), "answer")
    for key in (prompt_key, answer_key):
        if key.split(".")[0] not in columns:
            raise DataError(f"dataset {path!r}: no column {key!r} (it has {columns})")
    return prompt_key, answer_key


def _text(params: base.Params, key: str) -> str | None:
    value = params.get(key)
    return None if value is None else str(value)


def make(params: base.Params, *, held_out: int, seed: int) -> DatasetTask:
    # The job's models checked these already; a direct caller (a test, a benchmark) too.
    if found := taskparams.problems(NAME, params):
        raise ValueError(f"task {NAME}: {'; '.join(found)}")
    path = str(params["path"])
    data = open_file(path)
    fmt = _text(params, "format")
    if fmt is None:
        fmt = detect_format(data.column_names)
        log.info("dataset %s: format detected as %s (columns %s)", path, fmt, data.column_names)
    prompt_key, answer_key = _keys(params, fmt, data.column_names, path)
    reward = rewards.make(
        _text(params, "reward") or "exact",
        style=_text(params, "rewardStyle"),
        timeout=float(params.get("rewardTimeout", taskparams.DEFAULT_REWARD_TIMEOUT)),
    )
    task = DatasetTask(
        data, source=path, fmt=fmt, prompt_key=prompt_key, answer_key=answer_key, reward=reward,
        held_out=[],
    )  # fmt: skip
    held_path = _text(params, "heldOutPath")
    if held_path:
        other = open_file(held_path)
        task._held_out = [
            task.problem(i, other, held_path) for i in range(min(held_out, len(other)))
        ]
        _check_disjoint(task, held_path)
        return task
    fraction = float(params.get("heldOutFraction", taskparams.DEFAULT_HELD_OUT_FRACTION))
    count = min(held_out, int(len(data) * fraction))
    indices = random.Random(f"{NAME}/held-out/{seed}").sample(range(len(data)), count)
    task._held_out = [task.problem(i) for i in sorted(indices)]
    task._excluded = frozenset(indices)
    return task


def _check_disjoint(task: DatasetTask, held_path: str) -> None:
    """No held-out prompt may appear in training: scanned in Arrow batches, not loaded whole."""
    held = {p.id: p for p in task.held_out()}
    column = task.prompt_key.split(".")[0]
    offset = 0
    for batch in task.data.select_columns([column]).iter(batch_size=10_000):
        for i, prompt in enumerate(batch[column]):
            key = prompt if isinstance(prompt, str) else _messages_key(prompt)
            if key is not None and base.problem_id(NAME, key) in held:
                raise DataError(
                    f"held-out file {held_path!r} shares a prompt with training row "
                    f"{offset + i} of {task.source!r}: held-out problems must never be trained on"
                )
        offset += len(batch[column])


def _messages(prompt: Any) -> tuple[dict[str, str], ...] | None:
    """A prompt's chat messages, only role and content kept; None if it is not a chat."""
    if not isinstance(prompt, list) or not prompt or not all(_is_message(m) for m in prompt):
        return None
    return tuple({"role": m["role"], "content": m["content"]} for m in prompt)


def _messages_key(prompt: Any) -> str | None:
    messages = _messages(prompt)
    return None if messages is None else json.dumps(messages, sort_keys=True)
