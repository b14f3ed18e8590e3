"""`trainer.uniformGroups`: groups rewarded alike are left out of the trainer's batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tests.unit.workers.trainer_batches import two_groups

from polyrl.api.resources import RLJobSpec
from polyrl.workers.trainer import batching, learner


def make(workdir: Path, *, skip: bool, refill: bool = False) -> learner.Learner:
    uniform = "refill" if refill else "skip" if skip else "keep"
    job = RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://uniform-test"},
                    "trainer": {
                        "batchSize": 12,
                        "microBatchSize": 4,
                        "optimizer": {"lr": 1e-2},
                        "uniformGroups": uniform,
                    },
                }
            ],
            "algorithm": {"groupSize": 4},
        }
    )
    made = learner.Learner(job.policies[0], job.algorithm, workdir=workdir)
    made.sync_from_leader()
    return made


def all_right(group: str) -> list[batching.Sample]:
    """A group of four completions that were all rewarded 1: zero advantages."""
    return [dataclasses.replace(s, reward=1.0, group_id=group) for s in two_groups()[:4]]


def weights(made: learner.Learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in made.model.state_dict().items()}


def test_informative_keeps_the_samples_of_groups_whose_rewards_differ_in_order() -> None:
    mixed = two_groups()
    batch = [*all_right("a")[:2], mixed[0], *all_right("b")[:2], *mixed[1:]]
    assert batching.informative(batch) == mixed
    assert batching.informative(all_right("a")) == []


@pytest.mark.parametrize("refill", [False, True], ids=["skip", "refill"])
def test_a_batch_with_uniform_groups_trains_exactly_like_its_other_groups_alone(
    tmp_path: Path, refill: bool
) -> None:
    # refill: the runner leaves them out in async mode; a sync-mode batch still has them.
    skipping = make(tmp_path / "models", skip=True, refill=refill)
    stats = skipping.step([*all_right("u"), *two_groups()])
    alone = make(tmp_path / "models", skip=False)
    alone.step(two_groups())
    for name, tensor in weights(alone).items():
        torch.testing.assert_close(skipping.model.state_dict()[name], tensor, msg=name)
    assert stats["trained_fraction"] == 8 / 12
    # The reward figure is the whole batch's, not only what was trained on.
    assert stats["reward"] == (4 + 4) / 12


def test_without_the_setting_uniform_groups_are_trained_on_and_dilute_the_token_mean(
    tmp_path: Path,
) -> None:
    keeping = make(tmp_path / "models", skip=False).step([*all_right("u"), *two_groups()])
    alone = make(tmp_path / "models", skip=False).step(two_groups())
    assert keeping["trained_fraction"] == 1.0
    # The uniform group's tokens have zero advantage: the same policy-gradient sum is
    # averaged over 36 completion tokens instead of 24, the uniform group's share of the batch.
    assert alone["loss"] != 0
    assert keeping["loss"] == pytest.approx(alone["loss"] * 24 / 36, rel=1e-5)


def test_a_batch_of_only_uniform_groups_counts_as_a_step_and_leaves_the_weights(
    tmp_path: Path,
) -> None:
    made = make(tmp_path / "models", skip=True)
    before = weights(made)
    stats = made.step([*all_right("a"), *all_right("b")])
    assert made.state.step == 1
    assert stats["trained_fraction"] == 0.0
    assert stats["reward"] == 1.0
    assert made.optimizer.state == {}  # no optimizer step was taken
    for name, tensor in before.items():
        assert torch.equal(made.model.state_dict()[name], tensor), name
