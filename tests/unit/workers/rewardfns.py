"""Reward functions as users write them for verl, TRL and OpenRLHF, for the dataset tests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

SEEN: dict[str, Any] = {}


def verl_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None
) -> Any:
    SEEN["verl"] = (data_source, extra_info)
    score = 1.0 if solution_str.strip().endswith(ground_truth) else 0.0
    # verl routes by data_source: this source's scorer returns a dict, as some of verl's do.
    return {"score": score, "acc": score} if data_source == "polyrl/math-words" else score


async def verl_async(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None
) -> float:
    await asyncio.sleep(0)
    return 0.5


def trl_reward(prompts: list[Any], completions: list[str], **columns: Any) -> list[float | None]:
    SEEN["trl"] = sorted(columns)
    return [None if c == "n/a" else float(len(c)) for c in completions]


def openrlhf_reward(queries: list[str], prompts: list[str], labels: list[str]) -> list[float]:
    SEEN["openrlhf"] = (queries, prompts, labels)
    return [1.0 if q.endswith(label) else 0.0 for q, label in zip(queries, labels, strict=True)]


def raises(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    raise KeyError("no scorer for this data source")


def slow(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    time.sleep(2)
    return 1.0


def text(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> str:
    return "good"


def unknown(a: int, b: int) -> float:
    return 0.0
