"""Packed micro-batches (`trainer.microBatchTokens`): the same log-probs, loss and gradients
as the padded path, in float64, on the Llama, Qwen2 and Qwen3 test models; plans by rows and
by tokens; every rank the same number of micro-batches."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyrl.api.resources import AlgorithmSpec
from polyrl.workers.trainer import batching, packing
from polyrl.workers.trainer.objectives import Normaliser, policy_loss

TinyBpe = Callable[[str], Path]


def long_tailed(vocab: int, seed: int = 0) -> list[batching.Sample]:
    """Eight samples, prompts of 2-9 tokens, completions of 1-30 (two long ones), one with
    a shown stretch under its mask."""
    rng = random.Random(seed)
    out = []
    for i, n in enumerate([3, 1, 30, 5, 2, 24, 7, 4]):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))]
        completion = [rng.randrange(3, vocab) for _ in range(n)]
        mask = [j % 5 != 2 for j in range(n)] if i == 2 else None
        out.append(
            batching.Sample(
                prompt, completion, [-rng.random() * 3 for _ in range(n)], float(i % 2),
                f"g{i // 4}", 0, completion_mask=mask,
            )
        )  # fmt: skip
    return batching.assign_advantages(out)


@pytest.mark.slow  # loads three tiny models in float64: a few seconds
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_packed_logprobs_loss_and_gradients_equal_the_padded_paths_in_float64(
    arch: str, tiny_bpe: TinyBpe
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_bpe(arch), dtype=torch.float64)
    torch.nn.Module.eval(model)  # no dropout: the two paths see the same function
    batch = batching.collate(long_tailed(int(model.config.vocab_size)), pad_id=0)
    loss = AlgorithmSpec.model_validate({"loss": {"name": "gspo"}}).resolved_loss()

    def run(packed: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        args = (batch.input_ids, batch.attention_mask, batch.loss_mask, 0.7)
        new = (
            packing.packed_logprobs(model, *args)
            if packed
            else batching.completion_logprobs(model, *args)
        )
        value, _ = policy_loss(
            new, batch.old_logprobs, batch.advantages, batch.loss_mask, loss=loss,
            prox=new.detach() - 0.01, normaliser=Normaliser(tokens=50.0, sequences=8.0),
        )  # fmt: skip
        value.backward()  # type: ignore[no-untyped-call]
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return new.detach(), value.detach(), grads

    padded, packed = run(False), run(True)
    assert padded[0].dtype == packed[0].dtype == torch.float64
    assert torch.equal(padded[0] != 0, batch.loss_mask)
    assert (padded[0] - packed[0]).abs().max().item() < 1e-9
    assert abs(padded[1].item() - packed[1].item()) < 1e-9
    assert padded[2].keys() == packed[2].keys()
    for name, grad in padded[2].items():
        assert (grad - packed[2][name]).abs().max().item() < 1e-9, name


@pytest.mark.slow
def test_without_the_block_mask_a_packed_row_would_attend_across_samples(
    tiny_bpe: TinyBpe,
) -> None:
    """The check above can fail: one causal row over the same tokens (positions counting on,
    so transformers sees one sequence) gives other log-probs for every sample after the
    first."""
    model = AutoModelForCausalLM.from_pretrained(tiny_bpe("qwen3"), dtype=torch.float64)
    torch.nn.Module.eval(model)
    batch = batching.collate(long_tailed(int(model.config.vocab_size))[:2], pad_id=0)
    rows, cols = batch.attention_mask.bool().nonzero(as_tuple=True)
    ids = batch.input_ids[rows, cols].unsqueeze(0)
    with torch.no_grad():
        joined = model(input_ids=ids, use_cache=False).logits[0]
        blocked = model(input_ids=ids, position_ids=cols.unsqueeze(0), use_cache=False).logits[0]
    first = int(batch.attention_mask[0].sum())
    assert torch.allclose(joined[:first], blocked[:first], atol=1e-9)
    assert (joined[first:] - blocked[first:]).abs().max().item() > 1e-3


def test_a_token_budget_fills_micro_batches_in_order_and_a_long_row_goes_alone() -> None:
    assert packing.by_tokens([3, 4, 2, 10, 1, 1], budget=8) == [[0, 1], [2], [3], [4, 5]]
    assert packing.by_tokens([], budget=8) == []
    assert packing.by_rows(5, 2) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="budget"):
        packing.by_tokens([1], budget=0)


def test_every_rank_gets_as_many_micro_batches_as_the_busiest() -> None:
    plans = packing.balanced([[[0, 1], [2]], [[0]], []])
    assert [len(p) for p in plans] == [2, 2, 2]
    assert plans[1] == [[0], []]
    assert plans[2] == [[], []]
