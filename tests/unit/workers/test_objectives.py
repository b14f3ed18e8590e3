"""The objectives of `algorithm.loss`: each against a hand-computed example in plain floats,
a float64 gradcheck, the multi-turn loss mask, and the three aggregations."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.api.objectives import Aggregation, LossName, LossSpec
from polyrl.api.resources import AlgorithmSpec, ResolvedLoss
from polyrl.workers.trainer.objectives import Normaliser, policy_loss
from polyrl.workers.trainer.objectives.m2po import second_moment_mask

F64 = torch.float64
# 2 sequences x 4 tokens; row 1's last token is padding (-inf behaviour log-prob).
NEW = [[-1.0, -0.5, -2.0, -0.3], [-0.3, -3.0, -0.7, 0.0]]
PROX = [[-1.1, -0.6, -1.5, -0.3], [-0.2, -2.9, -0.9, 0.0]]
OLD = [[-1.2, -1.0, -2.5, -0.2], [-0.2, -2.1, -0.9, -math.inf]]
MASK = [[1, 1, 1, 1], [1, 1, 1, 0]]
ADV = [1.0, -1.0]


def settings(name: str, **loss: object) -> ResolvedLoss:
    return AlgorithmSpec.model_validate({"loss": {"name": name, **loss}}).resolved_loss()


def run(
    s: ResolvedLoss, mask: list[list[int]] = MASK, **kw: object
) -> tuple[float, dict[str, float]]:
    loss, stats = policy_loss(
        torch.tensor(NEW, dtype=F64),
        torch.tensor(OLD, dtype=F64),
        torch.tensor(ADV, dtype=F64),
        torch.tensor(mask, dtype=torch.bool),
        loss=s,
        prox=torch.tensor(PROX, dtype=F64),
        **kw,  # type: ignore[arg-type]
    )
    return loss.item(), stats


def tokens(mask: list[list[int]] = MASK) -> list[tuple[int, int]]:
    return [(r, c) for r in range(2) for c in range(4) if mask[r][c]]


def test_gspo_clips_the_sequences_geometric_mean_ratio_as_computed_by_hand() -> None:
    s = settings("gspo")
    lo, hi = 1 - 3e-4, 1 + 4e-4
    expected, clipped = 0.0, 0
    for r in range(2):
        cols = [c for c in range(4) if MASK[r][c]]
        ratio = math.exp(sum(NEW[r][c] - PROX[r][c] for c in cols) / len(cols))
        weight = min(math.exp(sum(PROX[r][c] - OLD[r][c] for c in cols) / len(cols)), 2.0)
        a = ADV[r]
        expected += -weight * min(ratio * a, max(lo, min(hi, ratio)) * a)  # per sequence
        clipped += len(cols) * ((a > 0 and ratio > hi) or (a < 0 and ratio < lo))
    value, stats = run(s)
    assert s.aggregation == Aggregation.SEQUENCE_MEAN
    assert value == pytest.approx(expected / 2, rel=1e-12)
    assert stats["clip_frac"] == pytest.approx(clipped / 7)


def test_cispo_weighs_every_token_by_its_clipped_ratio_as_computed_by_hand() -> None:
    s = settings("cispo")
    expected, clipped = 0.0, 0
    for r, c in tokens():
        ratio = math.exp(NEW[r][c] - OLD[r][c])
        weight = max(0.0, min(1.28, ratio))
        expected += -weight * ADV[r] * NEW[r][c]
        clipped += ratio > 1.28
    value, stats = run(s)
    assert value == pytest.approx(expected / 7, rel=1e-12)
    assert stats["clip_frac"] == pytest.approx(clipped / 7)
    assert clipped > 0  # the example exercises the clip


def test_cispos_gradient_is_reinforce_weighted_by_the_clipped_ratio_even_where_clipped() -> None:
    new = torch.tensor(NEW, dtype=F64, requires_grad=True)
    loss, _ = policy_loss(
        new, torch.tensor(OLD, dtype=F64), torch.tensor(ADV, dtype=F64),
        torch.tensor(MASK, dtype=torch.bool), loss=settings("cispo"),
    )  # fmt: skip
    loss.backward()  # type: ignore[no-untyped-call]
    assert new.grad is not None
    for r, c in tokens():
        weight = max(0.0, min(1.28, math.exp(NEW[r][c] - OLD[r][c])))
        assert new.grad[r, c].item() == pytest.approx(-weight * ADV[r] / 7, rel=1e-12)


def test_m2po_masks_the_largest_second_moments_until_the_mean_is_bounded_by_hand() -> None:
    s = settings("m2po", m2Threshold=0.04)
    log_r = {(r, c): NEW[r][c] - OLD[r][c] for r, c in tokens()}
    trust = [t for t, lr in log_r.items() if (ADV[t[0]] > 0) == (lr > 0) and lr != 0]
    order = sorted(trust, key=lambda t: log_r[t] ** 2)
    kept = list(order)
    while kept and sum(log_r[t] ** 2 for t in kept) / len(kept) > 0.04:
        kept.pop()  # the largest goes first
    masked = set(trust) - set(kept)
    assert masked  # the example exercises the mask
    expected = sum(-math.exp(lr) * ADV[t[0]] for t, lr in log_r.items() if t not in masked)
    value, stats = run(s)
    assert value == pytest.approx(expected / 7, rel=1e-12)  # masked tokens stay counted
    assert stats["clip_frac"] == pytest.approx(len(masked) / 7)
    assert stats["m2_kept"] <= stats["is_m2"]


def test_the_m2po_mask_keeps_everything_when_the_second_moment_is_already_small() -> None:
    log_ratio = torch.tensor([[0.1, -0.1, 0.05]], dtype=F64)
    keep = second_moment_mask(
        log_ratio,
        torch.tensor([[1.0, -1.0, 1.0]], dtype=F64),
        torch.ones(1, 3, dtype=torch.bool),
        0.04,
    )
    assert bool(keep.all())


def test_grpo_and_dapo_share_the_decoupled_ppo_loss() -> None:
    assert run(settings("grpo"))[0] == run(settings("dapo"))[0]


@pytest.mark.parametrize("aggregation", list(Aggregation))
def test_each_aggregation_divides_the_token_losses_as_its_definition_says(
    aggregation: Aggregation,
) -> None:
    s = settings("cispo", aggregation=aggregation.value)
    per = {(r, c): -max(0.0, min(1.28, math.exp(NEW[r][c] - OLD[r][c]))) * ADV[r] * NEW[r][c]
           for r, c in tokens()}  # fmt: skip
    if aggregation == Aggregation.TOKEN_MEAN:
        expected = sum(per.values()) / 7
    elif aggregation == Aggregation.SEQUENCE_MEAN:
        rows = [[v for (r, _), v in per.items() if r == row] for row in range(2)]
        expected = sum(sum(v) / len(v) for v in rows) / 2
    else:
        expected = sum(per.values()) / (2 * s.max_new_tokens)
    assert run(s)[0] == pytest.approx(expected, rel=1e-12)


def test_a_step_normaliser_divides_a_micro_batch_by_the_steps_counts() -> None:
    s = settings("cispo")
    alone = run(s)[0]
    assert run(s, normaliser=Normaliser(tokens=14.0))[0] == pytest.approx(alone / 2, rel=1e-12)


# A multi-turn sample: tokens 1 and 2 of row 0 are a tool's output, shown, not sampled.
TURNS = [[1, 0, 0, 1], [1, 1, 1, 0]]


@pytest.mark.parametrize("name", [n.value for n in LossName])
def test_no_objective_reads_or_trains_the_tokens_off_the_loss_mask(name: str) -> None:
    s = settings(name)
    garbage = [row[:] for row in NEW]
    garbage[0][1], garbage[0][2] = 5.0, -40.0  # what a shown token's value could be
    new = torch.tensor(garbage, dtype=F64, requires_grad=True)
    loss, _ = policy_loss(
        new, torch.tensor(OLD, dtype=F64), torch.tensor(ADV, dtype=F64),
        torch.tensor(TURNS, dtype=torch.bool), loss=s, prox=torch.tensor(PROX, dtype=F64),
    )  # fmt: skip
    loss.backward()  # type: ignore[no-untyped-call]
    assert new.grad is not None
    assert new.grad[0, 1].item() == 0
    assert new.grad[0, 2].item() == 0
    assert loss.item() == pytest.approx(run(s, mask=TURNS)[0], rel=1e-12)


def test_gspos_sequence_ratio_is_the_mean_over_sampled_tokens_only() -> None:
    s = settings("gspo", clipLow=0.9, clipHigh=9.0)  # wide: no clip, so the ratio shows
    value, _ = run(s, mask=TURNS)
    cols = [0, 3]
    ratio = math.exp(sum(NEW[0][c] - PROX[0][c] for c in cols) / 2)
    weight = min(math.exp(sum(PROX[0][c] - OLD[0][c] for c in cols) / 2), 2.0)
    ratio1 = math.exp(sum(NEW[1][c] - PROX[1][c] for c in range(3)) / 3)
    weight1 = min(math.exp(sum(PROX[1][c] - OLD[1][c] for c in range(3)) / 3), 2.0)
    expected = (-weight * ratio * ADV[0] - weight1 * ratio1 * ADV[1]) / 2
    assert value == pytest.approx(expected, rel=1e-12)


def random_case(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (3, 6)
    old = -torch.rand(shape, generator=g, dtype=F64) * 3 - 0.1
    prox = old + (torch.rand(shape, generator=g, dtype=F64) - 0.5) * 0.4
    new = prox + (torch.rand(shape, generator=g, dtype=F64) - 0.5) * 0.6
    mask = torch.ones(shape, dtype=torch.bool)
    mask[2, 4:] = False
    mask[0, 2] = False  # a shown token inside a sample
    return {"new": new, "old": old, "prox": prox, "mask": mask,
            "adv": torch.randn(shape[0], generator=g, dtype=F64),
            "ref": new + (torch.rand(shape, generator=g, dtype=F64) - 0.5)}  # fmt: skip


@pytest.mark.parametrize("name", [n.value for n in LossName])
@pytest.mark.parametrize("aggregation", list(Aggregation))
def test_every_objective_passes_gradcheck_in_float64(name: str, aggregation: Aggregation) -> None:
    extra = {"clipLow": 0.05, "clipHigh": 0.05} if name in ("gspo", "cispo") else {}
    s = settings(name, aggregation=aggregation.value, **extra)
    x = random_case(1)
    if name == "cispo":  # its weight is a stop-gradient: differences see it only where the
        # clip holds it constant, so every ratio sits past a bound (e or 1/e)
        signs = torch.where(torch.rand(x["new"].shape, dtype=F64) > 0.5, 1.0, -1.0)
        x["new"] = x["old"] + signs

    def loss_of(new: torch.Tensor) -> torch.Tensor:
        return policy_loss(
            new, x["old"], x["adv"], x["mask"], loss=s, prox=x["prox"], ref=x["ref"], kl_coef=0.1
        )[0]

    assert torch.autograd.gradcheck(loss_of, (x["new"].clone().requires_grad_(),))


def test_parameters_an_objective_does_not_use_are_refused_naming_the_field() -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"name": "grpo", "m2Threshold": 0.1}, "m2Threshold"),
        ({"name": "m2po", "clipHigh": 0.3}, "clipHigh"),
        ({"name": "gspo", "overlongPenalty": 1.0}, "overlongPenalty"),
    ]
    for loss, field in cases:
        with pytest.raises(ValueError, match=field):
            LossSpec.model_validate(loss)


def test_the_default_objective_is_todays_loss_with_the_algorithms_clip() -> None:
    algo = AlgorithmSpec.model_validate({"clipLow": 0.1, "clipHigh": 0.3})
    s = algo.resolved_loss()
    assert (s.name, s.clip_low, s.clip_high, s.aggregation) == (
        LossName.GRPO, 0.1, 0.3, Aggregation.TOKEN_MEAN,
    )  # fmt: skip
    assert s.advantage_std
    assert not s.overlong_filter
    assert s.overlong_buffer == 0
