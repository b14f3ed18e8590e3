"""GRPO math: advantages, staleness, the clipped TIS loss, and batch collation / alignment."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from polyrl.workers.trainer.batching import (
    Sample,
    assign_advantages,
    collate,
    completion_logprobs,
    token_logprobs,
)
from polyrl.workers.trainer.grpo import (
    age_histogram,
    age_quantile,
    filter_stale,
    group_advantages,
)
from polyrl.workers.trainer.objectives.ppo import decoupled_ppo_loss as grpo_loss
from polyrl.workers.trainer.objectives.terms import k3_kl, tis_weights

F64 = torch.float64
EPS = 1e-6
CLIP_LOW, CLIP_HIGH, TIS_CAP, KL_COEF = 0.2, 0.28, 2.0, 0.1


# --- the hand-computed loss -------------------------------------------------------------------

# 2 groups x 2 samples x 3 tokens. Rows 0, 1 are group "a", rows 2, 3 group "b".
REWARDS = [1.0, 0.0, 3.0, 1.0]
GROUPS = ["a", "a", "b", "b"]
NEW = [[-1.0, -0.5, -2.0], [-0.3, -3.0, -0.7], [-0.4, -1.1, 0.0], [-2.0, -0.1, -1.3]]
PROX = [[-1.0, -1.0, -1.5], [-0.2, -2.0, -0.9], [-0.4, -1.0, 0.0], [-2.2, -0.1, -1.0]]
OLD = [[-1.2, -1.0, -2.5], [-0.2, -2.1, -0.9], [-0.4, -0.9, -math.inf], [-1.5, -0.1, -1.0]]
REF = [[-1.1, -0.6, -1.8], [-0.3, -2.5, -0.8], [-0.5, -1.0, 0.0], [-1.9, -0.2, -1.2]]
MASK = [[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]]  # row 2's last token is padding


def hand_computed_loss() -> tuple[float, float, float]:
    """The loss, clip fraction and truncated fraction, from the definition, in plain floats."""
    # Group advantages: (reward - group mean) / (population std + eps).
    mean_a = (1.0 + 0.0) / 2  # 0.5
    std_a = math.sqrt(((1.0 - mean_a) ** 2 + (0.0 - mean_a) ** 2) / 2)  # 0.5
    mean_b = (3.0 + 1.0) / 2  # 2.0
    std_b = math.sqrt(((3.0 - mean_b) ** 2 + (1.0 - mean_b) ** 2) / 2)  # 1.0
    adv = [
        (1.0 - mean_a) / (std_a + EPS),  # ~ +1
        (0.0 - mean_a) / (std_a + EPS),  # ~ -1
        (3.0 - mean_b) / (std_b + EPS),  # ~ +1
        (1.0 - mean_b) / (std_b + EPS),  # ~ -1
    ]
    total, tokens, clipped_tokens, truncated_tokens = 0.0, 0, 0, 0
    for row in range(4):
        for col in range(3):
            if not MASK[row][col]:
                continue
            a = adv[row]
            ratio = math.exp(NEW[row][col] - PROX[row][col])
            raw_weight = math.exp(PROX[row][col] - OLD[row][col])
            weight = min(raw_weight, TIS_CAP)
            clipped_ratio = max(1 - CLIP_LOW, min(1 + CLIP_HIGH, ratio))
            pg = -weight * min(ratio * a, clipped_ratio * a)
            d = REF[row][col] - NEW[row][col]
            kl = math.exp(d) - d - 1
            total += pg + KL_COEF * kl
            tokens += 1
            clipped_tokens += (a > 0 and ratio > 1 + CLIP_HIGH) or (a < 0 and ratio < 1 - CLIP_LOW)
            truncated_tokens += raw_weight > TIS_CAP
    return total / tokens, clipped_tokens / tokens, truncated_tokens / tokens


def test_the_loss_of_a_two_group_batch_equals_the_hand_computed_value() -> None:
    expected_loss, expected_clip, expected_truncated = hand_computed_loss()
    # The chosen numbers exercise both clip sides and the cap: 3 clipped, 1 truncated of 11.
    assert expected_clip == pytest.approx(3 / 11)
    assert expected_truncated == pytest.approx(1 / 11)
    advantages = group_advantages(torch.tensor(REWARDS, dtype=F64), GROUPS, eps=EPS)
    loss, stats = grpo_loss(
        torch.tensor(NEW, dtype=F64),
        torch.tensor(OLD, dtype=F64),
        advantages,
        torch.tensor(MASK, dtype=torch.bool),
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        tis_cap=TIS_CAP,
        kl_coef=KL_COEF,
        ref_logprobs=torch.tensor(REF, dtype=F64),
        prox_logprobs=torch.tensor(PROX, dtype=F64),
    )
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    assert stats["loss"] == pytest.approx(expected_loss, rel=1e-12)
    assert stats["clip_frac"] == pytest.approx(expected_clip)
    assert stats["tis_truncated_frac"] == pytest.approx(expected_truncated)
    assert stats["num_tokens"] == 11
    assert math.isfinite(stats["tis_weight_mean"])  # the -inf under the padding is ignored


# --- differentiability and gradients ----------------------------------------------------------


def random_inputs(seed: int, shape: tuple[int, int] = (3, 5)) -> dict[str, torch.Tensor]:
    """Log-probs whose ratios stay well inside the clip range, except a few far outside it."""
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(shape, generator=g, dtype=F64) * 3 - 0.1
    new = prox + (torch.rand(shape, generator=g, dtype=F64) - 0.5) * 0.2  # ratio in 0.905..1.105
    new[0, 0] = prox[0, 0] + 0.7  # ratio 2.0: far past either bound
    new[1, 1] = prox[1, 1] - 0.7  # ratio 0.5
    mask = torch.ones(shape, dtype=torch.bool)
    mask[2, 3:] = False
    return {
        "new": new,
        "prox": prox,
        "old": torch.where(mask, prox - torch.rand(shape, generator=g, dtype=F64), -math.inf),
        "ref": new + (torch.rand(shape, generator=g, dtype=F64) - 0.5),
        "adv": torch.randn(shape[0], generator=g, dtype=F64),
        "mask": mask,
    }


@pytest.mark.parametrize("kl_coef", [0.0, 0.3])
def test_the_loss_passes_gradcheck_in_float64_with_and_without_kl(kl_coef: float) -> None:
    x = random_inputs(0)

    def loss_of(new: torch.Tensor) -> torch.Tensor:
        loss, _ = grpo_loss(
            new,
            x["old"],
            x["adv"],
            x["mask"],
            clip_low=CLIP_LOW,
            clip_high=CLIP_HIGH,
            tis_cap=TIS_CAP,
            kl_coef=kl_coef,
            ref_logprobs=x["ref"],
            prox_logprobs=x["prox"],
        )
        return loss

    new = x["new"].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(loss_of, (new,), eps=1e-6, atol=1e-8)


def test_a_token_clipped_in_its_advantages_direction_gets_no_gradient() -> None:
    # ratio 1.5 with A > 0 and ratio 0.5 with A < 0 are clipped; the opposite cases are not.
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=F64)
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.5]], dtype=F64)
    old = torch.full((1, 4), -1.0, dtype=F64)
    new = (old + ratio.log()).requires_grad_(True)
    loss, stats = grpo_loss(
        new, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.28, tis_cap=2.0
    )
    (grad,) = torch.autograd.grad(loss, new)
    # d/dnew of -A * r / N is -A * r / N where the unclipped branch is taken.
    expected = torch.tensor([[0.0, 0.0, -1.0 * 0.5 / 4, 1.0 * 1.5 / 4]], dtype=F64)
    torch.testing.assert_close(grad, expected)
    assert stats["clip_frac"] == pytest.approx(0.5)


# --- truncated importance sampling ------------------------------------------------------------


def test_tis_weights_are_capped_and_carry_no_gradient() -> None:
    old = torch.tensor([[-2.0, -1.0]], dtype=F64, requires_grad=True)
    prox = (
        old.detach() + torch.tensor([[math.log(5.0), math.log(0.5)]], dtype=F64)
    ).requires_grad_()
    new = prox.detach().clone().requires_grad_(True)  # ratio 1, inside the clip range
    adv = torch.tensor([[1.0, 1.0]], dtype=F64)
    weights = tis_weights(prox, old, tis_cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5]], dtype=F64))
    assert not weights.requires_grad
    loss, stats = grpo_loss(
        new,
        old,
        adv,
        torch.ones(1, 2),
        clip_low=0.2,
        clip_high=0.28,
        tis_cap=2.0,
        prox_logprobs=prox,
    )
    assert loss.item() == pytest.approx(-(2.0 * 1.0 + 0.5 * 1.0) / 2)
    grad_new, grad_old, grad_prox = torch.autograd.grad(loss, (new, old, prox), allow_unused=True)
    assert grad_old is None  # the weight (and the ratio's anchor) are constants of the step
    assert grad_prox is None
    torch.testing.assert_close(grad_new, torch.tensor([[-2.0 / 2, -0.5 / 2]], dtype=F64))
    assert stats["tis_weight_mean"] == pytest.approx(1.25)
    assert stats["tis_truncated_frac"] == pytest.approx(0.5)


def test_with_old_equal_to_new_and_no_clipping_the_loss_is_minus_the_mean_advantage() -> None:
    g = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(4, 6, generator=g, dtype=F64)
    adv = torch.randn(4, 6, generator=g, dtype=F64)
    mask = torch.rand(4, 6, generator=g) > 0.3
    loss, stats = grpo_loss(
        logprobs, logprobs, adv, mask, clip_low=0.2, clip_high=0.28, tis_cap=2.0
    )
    assert loss.item() == pytest.approx(-adv[mask].mean().item(), rel=1e-12)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["tis_weight_mean"] == pytest.approx(1.0)
    assert stats["clip_frac"] == 0.0
    assert stats["entropy_proxy"] == pytest.approx(-logprobs[mask].mean().item())


def test_per_sequence_advantages_and_a_given_token_count_behave_as_documented() -> None:
    x = random_inputs(2)

    def run(adv: torch.Tensor, num_tokens: float | None = None, kl: float = 0.0) -> float:
        loss, _ = grpo_loss(
            x["new"],
            x["old"],
            adv,
            x["mask"],
            clip_low=0.2,
            clip_high=0.28,
            tis_cap=2.0,
            kl_coef=kl,
            num_tokens=num_tokens,
        )
        return loss.item()

    per_sequence = run(x["adv"])
    assert per_sequence == pytest.approx(run(x["adv"][:, None].expand_as(x["new"])))
    tokens = int(x["mask"].sum())
    assert run(x["adv"], num_tokens=26.0) == pytest.approx(per_sequence * tokens / 26.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        run(x["adv"], kl=0.1)


def test_k3_is_zero_at_the_reference_and_positive_elsewhere() -> None:
    ref = torch.tensor([-1.0, -1.0, -1.0], dtype=F64)
    kl = k3_kl(torch.tensor([-1.0, -0.5, -2.0], dtype=F64), ref)
    assert kl[0].item() == 0.0
    assert bool((kl[1:] > 0).all())


# --- group advantages -------------------------------------------------------------------------


def test_groups_with_equal_rewards_get_zero_advantages() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 5.0])
    adv = group_advantages(rewards, ["x", "x", "x", "y", "y", "z"])
    assert adv[[0, 1, 2, 5]].tolist() == [0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv[3:5], torch.tensor([-1.0, 1.0]) / (1.0 + 1e-6))
    assert adv.dtype == torch.float32


def test_advantages_sum_to_zero_within_each_interleaved_group() -> None:
    rewards = torch.tensor([0.3, 2.0, 0.9, -1.0, 0.1, 4.0], dtype=F64)
    groups = ["p", "q", "p", "q", "p", "q"]
    for normalize_std in (True, False):
        adv = group_advantages(rewards, groups, normalize_std=normalize_std)
        assert adv[0::2].sum().item() == pytest.approx(0.0, abs=1e-12)
        assert adv[1::2].sum().item() == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.floats(-100, 100, allow_nan=False)),
        min_size=1,
        max_size=24,
    ),
    st.booleans(),
)
def test_group_advantages_hold_their_properties_for_random_rewards(
    items: list[tuple[str, float]], normalize_std: bool
) -> None:
    groups = [g for g, _ in items]
    rewards = torch.tensor([r for _, r in items], dtype=F64)
    adv = group_advantages(rewards, groups, normalize_std=normalize_std)
    assert bool(torch.isfinite(adv).all())
    for name in set(groups):
        idx = torch.tensor([i for i, g in enumerate(groups) if g == name])
        r, a = rewards[idx], adv[idx]
        if bool((r == r[0]).all()):
            assert bool((a == 0).all())
            continue
        assert a.sum().item() == pytest.approx(0.0, abs=1e-9 * max(1.0, r.abs().max().item()))
        std = r.std(correction=0).item()
        scale = std / (std + 1e-6) if normalize_std else std
        if std > 1e-12:  # below that the spread is subnormal noise; only finiteness matters
            assert a.std(correction=0).item() == pytest.approx(scale, rel=1e-6)
    reversed_adv = group_advantages(rewards.flip(0), groups[::-1], normalize_std=normalize_std)
    torch.testing.assert_close(reversed_adv, adv.flip(0))


def test_group_advantages_refuse_mismatched_or_non_finite_rewards() -> None:
    with pytest.raises(ValueError, match="group ids"):
        group_advantages(torch.tensor([1.0, 2.0]), ["a"])
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([1.0, math.nan]), ["a", "a"])


# --- staleness --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stamped:
    name: str
    weight_version: int


def test_filter_stale_drops_exactly_the_stale_samples_and_counts_them() -> None:
    samples = [Stamped(n, v) for n, v in [("a", 10), ("b", 9), ("c", 7), ("d", 8), ("e", 3)]]
    kept, dropped = filter_stale(samples, current_version=10, max_staleness=2)
    assert [s.name for s in kept] == ["a", "b", "d"]
    assert dropped == 2
    on_policy, dropped_all_but_one = filter_stale(samples, current_version=10, max_staleness=0)
    assert [s.name for s in on_policy] == ["a"]
    assert dropped_all_but_one == 4
    assert age_histogram(samples, current_version=10) == {0: 1, 1: 1, 2: 1, 3: 1, 7: 1}


def test_age_quantiles_are_nearest_rank_over_the_histogram() -> None:
    ages = {0: 10, 1: 7, 2: 2, 5: 1}  # 20 samples
    assert [age_quantile(ages, q) for q in (0.0, 0.5, 0.85, 0.9, 0.95, 1.0)] == [
        0.0, 0.0, 1.0, 2.0, 2.0, 5.0,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no samples"):
        age_quantile({}, 0.5)
    with pytest.raises(ValueError, match="quantile"):
        age_quantile(ages, 1.5)


def test_filter_stale_accepts_trajectory_samples() -> None:
    fresh = Sample([1], [2], [-0.5], reward=1.0, group_id="g", weight_version=5)
    stale = Sample([1], [3], [-0.7], reward=0.0, group_id="g", weight_version=1)
    kept, dropped = filter_stale([fresh, stale], current_version=6, max_staleness=4)
    assert kept == [fresh]
    assert dropped == 1


# --- collation and log-prob alignment ---------------------------------------------------------


def test_collate_aligns_completion_tokens_with_their_behaviour_logprobs() -> None:
    samples = assign_advantages(
        [
            Sample(
                [5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], reward=1.0, group_id="g", weight_version=3
            ),
            Sample([1], [2], [-0.5], reward=0.0, group_id="g", weight_version=2),
        ]
    )
    batch = collate(samples, pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [
        [False, False, True, True, True],
        [False, True] + [False] * 3,
    ]
    assert batch.input_ids[batch.loss_mask].tolist() == [7, 8, 9, 2]
    torch.testing.assert_close(
        batch.old_logprobs[batch.loss_mask], torch.tensor([-0.1, -0.2, -0.3, -0.5])
    )
    assert batch.old_logprobs[~batch.loss_mask].abs().sum().item() == 0.0
    a = 1.0 / (1.0 + 1e-6)  # rewards 1, 0: mean 0.5, std 0.5
    torch.testing.assert_close(
        batch.advantages[batch.loss_mask], torch.tensor([a, a, a, -a]), rtol=1e-6, atol=1e-6
    )
    assert batch.weight_versions.tolist() == [3, 2]
    assert batch.num_tokens == 4


def test_collate_refuses_misaligned_trajectories() -> None:
    with pytest.raises(ValueError, match="behaviour log-probs"):
        collate([Sample([1], [2, 3], [-0.1], reward=0.0, group_id="g", weight_version=0)], 0)
    with pytest.raises(ValueError, match="empty prompt"):
        collate([Sample([], [2], [-0.1], reward=0.0, group_id="g", weight_version=0)], 0)
    with pytest.raises(ValueError, match="empty batch"):
        collate([], 0)


def test_token_logprobs_match_a_manual_gather_of_tempered_log_softmax() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 6, generator=g, dtype=F64, requires_grad=True)
    ids = torch.randint(0, 6, (2, 5), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)
    temperature = 0.7
    out = token_logprobs(logits, ids, mask, temperature)
    for b in range(2):
        for t in range(5):
            if mask[b, t]:
                row = torch.log_softmax(logits[b, t - 1] / temperature, dim=-1)
                expected = row[ids[b, t]].item()
            else:
                expected = 0.0
            assert out[b, t].item() == pytest.approx(expected, rel=1e-12)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    assert grad[:, -1].abs().sum().item() == 0.0  # the last logits predict nothing here
    with pytest.raises(ValueError, match="position 0"):
        token_logprobs(logits, ids, torch.ones(2, 5, dtype=torch.bool), 1.0)


def test_a_sampled_rollout_rescored_by_the_same_model_has_ratio_one() -> None:
    """End to end alignment: sample from a bigram model, collate, rescore, compare."""
    g = torch.Generator().manual_seed(4)
    vocab, temperature = 7, 0.8
    table = torch.randn(vocab, vocab, generator=g)  # logits of the next token given the last
    samples = []
    for prompt_len, completion_len in [(1, 4), (3, 2), (2, 1)]:
        tokens = torch.randint(1, vocab, (prompt_len,), generator=g).tolist()
        completion, logprobs = [], []
        for _ in range(completion_len):
            dist = torch.log_softmax(table[tokens[-1]] / temperature, dim=-1)
            token = int(torch.multinomial(dist.exp(), 1, generator=g))
            completion.append(token)
            logprobs.append(float(dist[token]))
            tokens.append(token)
        samples.append(Sample(tokens[:prompt_len], completion, logprobs, 0.0, "g", 0))
    batch = collate(samples, pad_id=0)
    new = token_logprobs(table[batch.input_ids], batch.input_ids, batch.loss_mask, temperature)
    torch.testing.assert_close(new, batch.old_logprobs)
    _, stats = grpo_loss(
        new,
        batch.old_logprobs,
        batch.advantages,
        batch.loss_mask,
        clip_low=0.2,
        clip_high=0.28,
        tis_cap=2.0,
    )
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["num_tokens"] == 7


def test_token_logprobs_of_bf16_logits_are_computed_in_float32() -> None:
    logits = torch.randn(1, 3, 4).to(torch.bfloat16)
    out = token_logprobs(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 1]]).bool(), 1.0)
    assert out.dtype == torch.float32


def test_completion_logprobs_computes_the_head_only_where_scored_with_the_same_result() -> None:
    """Rows of different prompt lengths, right-padded: the log-probs from the logits of the
    tail columns equal those of the whole sequence's logits, and the model was asked for
    logits from the column before the earliest completion token only."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=64)  # fmt: skip
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    samples = [
        Sample([5, 6, 7, 8, 9, 10], [11, 12], [-1.0, -1.0], 1.0, "g", 0),
        Sample([5, 6, 7], [13, 14, 15, 16], [-1.0] * 4, 0.0, "g", 0),
    ]
    batch = collate(samples, pad_id=0)
    asked: list[int] = []
    forward = model.forward

    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["logits_to_keep"])
        return forward(*args, **kwargs)

    model.forward = spy
    tail = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, 0.7)
    whole = token_logprobs(
        forward(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
        batch.input_ids, batch.loss_mask, 0.7,
    )  # fmt: skip
    assert asked == [batch.input_ids.shape[1] - 2]  # from column 2: before the 2nd row's first
    torch.testing.assert_close(tail, whole, atol=1e-6, rtol=0)
    assert bool((tail[batch.loss_mask] != 0).all())
