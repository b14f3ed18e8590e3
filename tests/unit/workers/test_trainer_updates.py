"""`trainer.updatesPerBatch`: several optimizer steps per batch, clipped against the first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from tests.unit.workers.trainer_batches import two_groups

from polyrl.api.resources import RLJobSpec
from polyrl.workers.trainer import learner


def spec(updates: int) -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://updates-test"},
                    "trainer": {
                        "batchSize": 8,
                        "microBatchSize": 4,
                        "updatesPerBatch": updates,
                        "optimizer": {"lr": 1e-2},
                    },
                }
            ],
            "algorithm": {"groupSize": 4},
        }
    )


def make(workdir: Path, updates: int) -> learner.Learner:
    job = spec(updates)
    made = learner.Learner(job.policies[0], job.algorithm, workdir=workdir)
    made.sync_from_leader()
    return made


def adam_steps(made: learner.Learner) -> set[float]:
    return {float(state["step"]) for state in made.optimizer.state.values()}


@pytest.mark.slow  # trains a tiny model: 1-5 s, 8-10 s beside other jobs on 2 cores
def test_each_batch_takes_updates_per_batch_optimizer_steps_and_counts_as_one_step(
    tmp_path: Path,
) -> None:
    made = make(tmp_path, 3)
    made.step(two_groups())
    assert made.state.step == 1
    assert adam_steps(made) == {3.0}
    made.step(two_groups())
    assert made.state.step == 2
    assert adam_steps(made) == {6.0}


@pytest.mark.slow  # trains a tiny model: 1-5 s, 8-10 s beside other jobs on 2 cores
def test_later_updates_measure_their_ratio_against_the_policy_before_the_first(
    tmp_path: Path,
) -> None:
    # One update: the clip's anchor is the policy being optimised, so every ratio is 1.
    assert make(tmp_path / "one", 1).step(two_groups())["ratio_mean"] == pytest.approx(
        1.0, abs=1e-6
    )
    # Three: the last update's ratio is to the log-probs before the first, which moved since.
    stats = make(tmp_path / "three", 3).step(two_groups())
    assert abs(stats["ratio_mean"] - 1.0) > 1e-4


@pytest.mark.slow  # trains a tiny model: 1-5 s, 8-10 s beside other jobs on 2 cores
def test_more_updates_move_the_weights_further_from_the_same_start(tmp_path: Path) -> None:
    start = make(tmp_path / "start", 1).model.state_dict()

    def distance(updates: int) -> float:
        made = make(tmp_path / str(updates), updates)
        made.step(two_groups())
        moved = made.model.state_dict()
        return sum(float((moved[k] - start[k]).norm()) for k in start)

    assert distance(3) > distance(1) > 0


@pytest.mark.parametrize("updates", [0, 17])
def test_updates_per_batch_outside_1_to_16_is_refused_naming_the_field(updates: int) -> None:
    with pytest.raises(ValidationError, match=r"updates_per_batch|updatesPerBatch"):
        spec(updates)


@pytest.mark.slow  # trains a tiny model twice: a few seconds
def test_activation_checkpointing_recomputes_and_takes_the_same_step(tmp_path: Path) -> None:
    plain = make(tmp_path / "plain", 1)
    job = spec(1)
    job.policies[0].trainer.activation_checkpointing = True
    checkpointed = learner.Learner(job.policies[0], job.algorithm, workdir=tmp_path / "ac")
    checkpointed.sync_from_leader()
    assert checkpointed.model.is_gradient_checkpointing
    assert not plain.model.is_gradient_checkpointing
    plain.step(two_groups())
    checkpointed.step(two_groups())
    after = plain.weights()
    for name, tensor in checkpointed.weights().items():
        assert torch.allclose(tensor, after[name], atol=1e-6), name
