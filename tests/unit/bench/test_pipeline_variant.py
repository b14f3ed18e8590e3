"""`polyrl bench pipeline` runs the quick start in both modes to the same steps."""

from __future__ import annotations

import pytest

from polyrl.bench import pipeline as bench
from polyrl.local import jobfile


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_each_mode_trains_every_policy_the_same_steps_whatever_the_job_says(mode: str) -> None:
    job = jobfile.load(bench.job_path())
    assert job.spec.all_steps() != {p.name: 8 for p in job.spec.policies}  # its own budgets
    made = bench.variant(job, mode=mode, steps=8, warmup=50)
    assert made.spec.algorithm.mode == mode
    assert made.spec.all_steps() == {p.name: 8 for p in made.spec.policies}
    assert [p.trainer.warmup_steps for p in made.spec.policies] == [50, 50]


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_both_modes_skip_uniform_groups_where_the_job_refills(mode: str) -> None:
    job = jobfile.load(bench.job_path())
    assert "refill" in [p.trainer.uniform_groups for p in job.spec.policies]
    made = bench.variant(job, mode=mode, steps=8, warmup=50)
    assert [p.trainer.uniform_groups for p in made.spec.policies] == ["skip", "skip"]
