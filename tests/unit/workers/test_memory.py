"""The trainer's memory estimate, from a config alone, and the warning before start."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from polyrl.api.resources import PolicySpec, Strategy
from polyrl.workers import preflight
from polyrl.workers.models import memory

TinyBpe = Callable[[str], Path]


def policy(path: Path, memory_limit: str | None) -> PolicySpec:
    trainer = {"resources": {"limits": {"memory": memory_limit}}} if memory_limit else {}
    return PolicySpec.model_validate(
        {"name": "solver", "model": {"path": str(path)}, "trainer": trainer}
    )


def test_the_parameter_count_from_the_config_is_the_models(tiny_bpe: TinyBpe) -> None:
    directory = tiny_bpe("qwen3")
    model = AutoModelForCausalLM.from_pretrained(directory)
    config = AutoConfig.from_pretrained(directory)
    assert memory.parameters(config) == sum(p.numel() for p in model.parameters())


def test_a_trainer_declaring_less_memory_than_its_model_needs_is_warned_before_start(
    tiny_bpe: TinyBpe, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tiny_bpe("qwen2")
    with caplog.at_level(logging.WARNING, logger="polyrl.preflight"):
        preflight.policy_model(policy(directory, "1Mi"))
    [warning] = [r.getMessage() for r in caplog.records]
    assert "policy 'solver'" in warning
    assert "16 bytes a parameter" in warning
    assert "declares 0.0 GiB" in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="polyrl.preflight"):
        preflight.policy_model(policy(directory, "1Gi"))
        preflight.policy_model(policy(directory, None))  # nothing declared: nothing to compare
    assert caplog.records == []


def test_sixteen_bytes_a_parameter() -> None:
    assert memory.trainer_bytes(7_000_000_000) == 112_000_000_000


def test_sharded_the_estimate_is_a_share_of_sixteen_bytes_plus_the_largest_layer() -> None:
    whole = memory.trainer_bytes(7_000_000_000)
    layer = 200_000_000
    assert memory.trainer_bytes(7_000_000_000, ranks=8, largest_layer=layer) == (
        whole // 8 + 8 * layer
    )


def test_the_warning_accounts_for_the_strategy_and_the_ranks_of_a_pod(tiny_bpe: TinyBpe) -> None:
    spec = policy(tiny_bpe("qwen2"), "1Mi")
    n = 100_000_000
    ddp = memory.shortfall(spec, n)
    assert ddp is not None
    assert "each trainer rank needs" in ddp
    assert "sharded" not in ddp
    spec.trainer.strategy = Strategy.FSDP2
    spec.trainer.nproc_per_node = 4
    sharded = memory.shortfall(spec, n, largest_layer=1000)
    assert sharded is not None
    assert "4 ranks need about 1.5 GiB" in sharded  # 4 x (1.6 GB / 4 + 8 kB), not 4 x 1.6 GB
    assert "sharded over 4 ranks" in sharded
    spec.trainer.resources = None
    assert memory.shortfall(spec, n) is None  # nothing declared
