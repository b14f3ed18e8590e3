"""The RL learning-rate ramp: linear to lr over lrWarmupSteps, a function of the step alone."""

from __future__ import annotations

import pytest

from polyrl.api.resources import Optimizer
from polyrl.workers.trainer.learner import scheduled_lr


def test_without_a_ramp_every_step_uses_the_full_rate() -> None:
    assert [scheduled_lr(step, 1e-3, 0) for step in (0, 1, 500)] == [1e-3, 1e-3, 1e-3]


def test_the_ramp_climbs_linearly_and_then_holds() -> None:
    rates = [scheduled_lr(step, 1e-3, 4) for step in range(6)]
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_a_resumed_trainer_continues_the_ramp_where_it_stopped() -> None:
    assert scheduled_lr(2, 1e-3, 10) == pytest.approx(3e-4)


def test_the_optimizer_spec_defaults_to_no_ramp_and_refuses_a_negative_one() -> None:
    assert Optimizer().lr_warmup_steps == 0
    assert Optimizer.model_validate({"lrWarmupSteps": 10}).lr_warmup_steps == 10
    with pytest.raises(ValueError, match="lrWarmupSteps"):
        Optimizer.model_validate({"lrWarmupSteps": -1})
