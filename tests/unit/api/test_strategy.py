"""`trainer.strategy` and `trainer.activationCheckpointing`: defaults, and the combinations
refused before start (each message names both fields)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from polyrl.api.resources import EvalOn, Strategy, TrainerSpec


def trainer(**fields: Any) -> TrainerSpec:
    return TrainerSpec.model_validate(fields)


def test_the_default_is_data_parallel_without_activation_checkpointing() -> None:
    spec = trainer()
    assert spec.strategy == Strategy.DDP
    assert spec.activation_checkpointing is False


def test_fsdp2_is_accepted_alone_and_evaluating_through_the_pool() -> None:
    assert trainer(strategy="fsdp2").strategy == Strategy.FSDP2
    spec = trainer(strategy="fsdp2", evalEvery=5, evalOn="rollout", activationCheckpointing=True)
    assert (spec.eval_on, spec.activation_checkpointing) == (EvalOn.ROLLOUT, True)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"lora": {"rank": 8}}, "trainer.strategy fsdp2 does not support trainer.lora"),
        ({"evalEvery": 5}, "fsdp2 needs trainer.evalOn: rollout when trainer.evalEvery > 0"),
    ],
    ids=["with-lora", "evaluating-on-the-trainer"],
)
def test_fsdp2_refuses_what_rank_0_cannot_do_alone(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        trainer(strategy="fsdp2", **fields)
    trainer(**fields)  # data-parallel takes it


def test_checkpoints_written_in_the_background_are_for_sharded_trainers_only() -> None:
    assert trainer().checkpoint.async_writes is False
    assert trainer(strategy="fsdp2", checkpoint={"asyncWrites": True}).checkpoint.async_writes
    with pytest.raises(ValidationError, match=r"asyncWrites needs trainer\.strategy fsdp2"):
        trainer(checkpoint={"asyncWrites": True})
