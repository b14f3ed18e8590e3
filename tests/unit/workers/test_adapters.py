"""`models.adapters.Adapter`: PEFT-named adapter tensors grouped by the weight they move, and
refused when they are not a complete, consistent set."""

from __future__ import annotations

import pytest
import torch

from polyrl.workers.models.adapters import PREFIX, Adapter, merge

Q = f"{PREFIX}model.layers.0.self_attn.q_proj"
UP = f"{PREFIX}model.layers.0.mlp.up_proj"


def pair(layer: str, rank: int = 2, out: int = 6, into: int = 4) -> dict[str, torch.Tensor]:
    return {
        f"{layer}.lora_A.weight": torch.ones(rank, into),
        f"{layer}.lora_B.weight": torch.ones(out, rank),
    }


def test_pairs_are_keyed_by_the_base_weight_they_move_with_rank_scale_and_modules() -> None:
    adapter = Adapter(pair(Q) | pair(UP), alpha=8)
    assert set(adapter.pairs) == {
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    }
    assert (adapter.rank, adapter.scale, adapter.modules) == (2, 4.0, ["q_proj", "up_proj"])


def test_the_merge_is_base_plus_scaled_b_a_rounded_to_bf16_in_the_bases_dtype() -> None:
    base = torch.full((6, 4), 0.1)
    merged = merge(base, torch.ones(2, 4), torch.full((6, 2), 0.01), scale=4.0)
    assert merged.dtype == torch.float32
    expected = torch.tensor(0.1 + 4 * 0.02).to(torch.bfloat16).float()
    assert torch.equal(merged, torch.full((6, 4), float(expected)))


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({f"{Q}.lora_A.weight": torch.ones(2, 4)}, "only one of lora_A and lora_B"),
        ({"model.layers.0.self_attn.q_proj.weight": torch.ones(6, 4)}, "not a LoRA adapter"),
        (pair(Q, rank=2) | pair(UP, rank=4), "different ranks"),
        ({}, "holds no weights"),
        (
            {f"{Q}.lora_A.weight": torch.ones(2, 4), f"{Q}.lora_B.weight": torch.ones(6, 3)},
            "differ",
        ),
    ],
    ids=["lone-a", "not-peft", "two-ranks", "empty", "misfit"],
)
def test_an_incomplete_or_inconsistent_adapter_is_refused(
    tensors: dict[str, torch.Tensor], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Adapter(tensors, alpha=4)
