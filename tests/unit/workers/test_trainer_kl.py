"""The optional KL term: the trainer anchors to the policy RL started from, across restarts."""

from __future__ import annotations

from pathlib import Path

import torch
from tests.unit.workers.trainer_batches import two_groups

from polyrl.api.resources import RLJobSpec
from polyrl.workers.trainer import learner


def make(workdir: Path, kl_coef: float) -> learner.Learner:
    spec = RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://kl-test"},
                    "trainer": {"batchSize": 8, "microBatchSize": 4, "optimizer": {"lr": 1e-2}},
                }
            ],
            "algorithm": {"groupSize": 4, "klCoef": kl_coef},
        }
    )
    made = learner.Learner(spec.policies[0], spec.algorithm, workdir=workdir)
    made.sync_from_leader()
    return made


def weights(module: torch.nn.Module | None) -> dict[str, torch.Tensor]:
    assert module is not None
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_without_a_kl_coefficient_there_is_no_reference_model(tmp_path: Path) -> None:
    plain = make(tmp_path, 0.0)
    assert plain.reference is None
    assert plain.step(two_groups())["kl_mean"] == 0.0


def test_the_kl_term_measures_the_distance_from_the_starting_policy(tmp_path: Path) -> None:
    anchored = make(tmp_path, 0.1)
    start = weights(anchored.model)
    first = anchored.step(two_groups())  # the policy still is the reference here
    second = anchored.step(two_groups())
    assert abs(first["kl_mean"]) < 1e-6
    assert second["kl_mean"] > 1e-6
    assert all(torch.equal(start[k], v) for k, v in weights(anchored.reference).items())
    assert any(not torch.equal(start[k], v) for k, v in weights(anchored.model).items())


def test_a_resumed_trainer_keeps_the_anchor_rather_than_its_resumed_weights(
    tmp_path: Path,
) -> None:
    first = make(tmp_path, 0.1)
    for _ in range(2):
        first.step(two_groups())
    first.save()
    resumed = make(tmp_path, 0.1)
    assert resumed.state.step == 2
    anchor, moved = weights(first.reference), weights(resumed.model)
    assert all(torch.equal(anchor[k], v) for k, v in weights(resumed.reference).items())
    assert any(not torch.equal(anchor[k], v) for k, v in moved.items())
