"""A batch the trainer unit tests share: two groups of four, half of each rewarded."""

from __future__ import annotations

from polyrl.workers.trainer import batching


def two_groups() -> list[batching.Sample]:
    return [
        batching.Sample(
            prompt_ids=[1, 5 + i, 7],
            completion_ids=[9 + i, 10, 11 + i % 2],
            behaviour_logprobs=[-2.0, -2.1, -2.2],
            reward=float(i % 2),
            group_id=f"g{i // 4}",
            weight_version=0,
        )
        for i in range(8)
    ]
