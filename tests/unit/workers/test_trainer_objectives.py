"""The trainer with `algorithm.loss` and `trainer.miniBatches`: optimizer steps per batch,
clips that bind from the second mini-batch, DAPO's overlong treatment, the IS figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.unit.workers.trainer_batches import two_groups

from polyrl.api.resources import AlgorithmSpec, RLJobSpec
from polyrl.workers.trainer import batching, learner, overlong


def make(workdir: Path, *, loss: dict[str, Any], **trainer: Any) -> learner.Learner:
    job = RLJobSpec.model_validate(
        {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": "tiny-llama://objectives-test"},
                    "trainer": {"batchSize": 8, "microBatchSize": 4, "optimizer": {"lr": 1e-2}}
                    | trainer,
                }
            ],
            "algorithm": {"groupSize": 4, "maxNewTokens": 4, "loss": loss},
        }
    )
    made = learner.Learner(job.policies[0], job.algorithm, workdir=workdir)
    made.sync_from_leader()
    return made


def adam_steps(made: learner.Learner) -> set[float]:
    return {float(state["step"]) for state in made.optimizer.state.values()}


@pytest.mark.slow  # trains a tiny model: a few seconds on 2 cores
def test_mini_batches_take_one_optimizer_step_each_and_the_batch_counts_as_one_step(
    tmp_path: Path,
) -> None:
    made = make(tmp_path, loss={"name": "grpo"}, miniBatches=2, updatesPerBatch=2)
    stats = made.step(two_groups())
    assert made.state.step == 1
    assert adam_steps(made) == {4.0}  # 2 passes x 2 mini-batches
    assert stats["num_tokens"] == 2 * 8 * 3  # every token, in each of the two passes


@pytest.mark.slow  # trains a tiny model: a few seconds on 2 cores
def test_gspos_sequence_clip_binds_from_the_second_mini_batch_only(tmp_path: Path) -> None:
    one = make(tmp_path / "one", loss={"name": "gspo"}).step(two_groups())
    assert one["clip_frac"] == 0.0  # one update: current == proximal, nothing to clip
    four = make(tmp_path / "four", loss={"name": "gspo"}, updatesPerBatch=4).step(two_groups())
    assert four["clip_frac"] > 0.0


@pytest.mark.slow  # trains a tiny model: a few seconds on 2 cores
@pytest.mark.parametrize("name", ["grpo", "gspo", "dapo", "m2po", "cispo"])
def test_every_objective_trains_and_reports_its_importance_weight_figures(
    tmp_path: Path, name: str
) -> None:
    stale = [dataclasses.replace(s, behaviour_logprobs=[-4.0, -0.5, -3.0]) for s in two_groups()]
    made = make(tmp_path, loss={"name": name})
    before = {k: v.clone() for k, v in made.model.state_dict().items()}
    stats = made.step(stale)
    assert any(not (made.model.state_dict()[k] == v).all() for k, v in before.items())
    assert stats["is_deviation"] > 0.1  # the behaviour log-probs are far from the model's
    assert stats["is_m2"] > 0.1
    assert 0.0 <= stats["clip_frac"] <= 1.0
    if name == "m2po":
        assert stats["clip_frac"] > 0  # M2 far above 0.04: the outliers are masked
        assert stats["m2_kept"] <= 0.04 + 1e-9


def cut(sample: batching.Sample, reply: int) -> batching.Sample:
    """`sample` with a reply of `reply` sampled tokens, cut at the limit when over 4."""
    return dataclasses.replace(
        sample,
        completion_ids=[9] * reply,
        behaviour_logprobs=[-2.0] * reply,
        finish_reason="length" if reply >= 4 else "stop",
    )


def test_the_soft_overlong_penalty_grows_linearly_over_the_buffer() -> None:
    loss = AlgorithmSpec.model_validate(
        {"maxNewTokens": 8, "loss": {"name": "dapo", "overlongBufferTokens": 4}}
    ).resolved_loss()
    assert [overlong.penalty(n, loss) for n in (3, 4, 5, 6, 8, 9)] == [0, 0, 0.25, 0.5, 1, 1]
    shown = dataclasses.replace(
        two_groups()[0], completion_ids=[1] * 9, behaviour_logprobs=[0.0] * 9,
        completion_mask=[True] * 3 + [False] * 2 + [True] * 4,
    )  # fmt: skip
    assert overlong.longest_reply(shown) == 4  # a conversation is measured by its longest reply
    stopped = dataclasses.replace(shown, finish_reason="stop")
    assert overlong.longest_reply(stopped) == 3  # its end-of-turn token is not content
    cut_short = dataclasses.replace(shown, finish_reason="length")
    assert overlong.longest_reply(cut_short) == 4


def test_dapo_filters_samples_cut_at_the_limit_out_of_the_loss_and_counts_them() -> None:
    loss = AlgorithmSpec.model_validate({"loss": {"name": "dapo"}}).resolved_loss()
    samples = [cut(s, 4 if i < 3 else 2) for i, s in enumerate(two_groups())]
    kept, count = overlong.filtered(samples, loss)
    assert count == 3
    assert [batching.trained_tokens(s) for s in kept] == [0, 0, 0, 2, 2, 2, 2, 2]
    grpo = AlgorithmSpec().resolved_loss()
    assert overlong.filtered(samples, grpo) == (samples, 0)


@pytest.mark.slow  # trains a tiny model: a few seconds on 2 cores
def test_a_dapo_step_trains_on_none_of_a_cut_samples_tokens(tmp_path: Path) -> None:
    samples = [cut(s, 4 if i % 4 == 0 else 2) for i, s in enumerate(two_groups())]
    stats = make(tmp_path, loss={"name": "dapo", "overlongBufferTokens": 0}).step(samples)
    assert stats["overlong_fraction"] == 2 / 8
    assert stats["num_tokens"] == 6 * 2  # the six uncut samples' two tokens each


@pytest.mark.slow  # trains a tiny model twice: a few seconds on 2 cores
def test_a_packed_step_moves_the_weights_as_the_padded_step_does(tmp_path: Path) -> None:
    padded = make(tmp_path / "padded", loss={"name": "grpo"}, miniBatches=2)
    packed = make(tmp_path / "packed", loss={"name": "grpo"}, miniBatches=2, microBatchTokens=13)
    start = {k: v.clone() for k, v in padded.model.state_dict().items()}
    a, b = padded.step(two_groups()), packed.step(two_groups())
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    moved = 0
    for name, tensor in padded.model.state_dict().items():
        # fp32 (the float64 equality is test_packing's). Adam's first steps normalise each
        # gradient element, so fp32 rounding in a near-zero one moves it by up to a few % of
        # lr: bounded at 1% of the two mini-batch steps' largest possible move (2 x lr).
        diff = (packed.model.state_dict()[name] - tensor).abs().max().item()
        assert diff < 0.01 * 2 * 1e-2, name
        moved += int(not torch.equal(tensor, start[name]))
    assert moved > 0
