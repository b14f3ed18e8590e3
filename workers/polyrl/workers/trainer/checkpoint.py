"""Trainer checkpoints: weights (safetensors), optimizer state, step, version and epoch.

A LoRA policy's checkpoint holds its adapter instead of the weights, in PEFT's format
(`adapter_model.safetensors`, `adapter_config.json`), with the base model's source
(`base.json`), from which `polyrl export` rebuilds the merged model.

Written atomically (a temporary directory renamed into place), so a trainer killed while
writing resumes from the previous checkpoint rather than a torn one. Each resume starts a
new epoch; versions carry on after the last one announced, so no version number is ever
published twice (docs/dataplane.md, "Checkpoint and resume").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from polyrl.api.model_source import ModelSource
from polyrl.workers.errors import ConfigError
from polyrl.workers.models import lora

log = logging.getLogger("polyrl.trainer")
STATE = "trainer.json"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
REFERENCE = "reference.safetensors"  # the KL anchor, when the trainer has one
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # a LoRA policy's adapter, PEFT's file names
ADAPTER_CONFIG = "adapter_config.json"
BASE = "base.json"  # a LoRA policy's base model source (`polyrl.api.resources.ModelSource`)


@dataclass
class TrainerState:
    step: int = 0
    version: int = -1  # last published version; -1: nothing published yet
    epoch: int = 0


def save(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    *,
    tokenizer: Any = None,
    reference: torch.nn.Module | None = None,
    base: ModelSource | None = None,
) -> None:
    """Write the checkpoint; with the model's config and `tokenizer` it is also an HF directory.

    The config and tokenizer make a checkpoint self-describing: `polyrl export` (and
    `AutoModelForCausalLM.from_pretrained`) need nothing but the directory. A sharded
    trainer writes its own kind (`sharded_checkpoint`).
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".ckpt.", dir=directory.parent))
    try:
        if lora.is_lora(model):
            save_adapter(model, staging, base)
        else:
            save_weights(model, staging / WEIGHTS)
        torch.save(optimizer.state_dict(), staging / OPTIMIZER)
        if reference is not None:
            save_weights(reference, staging / REFERENCE)
        (staging / STATE).write_text(json.dumps(asdict(state)))
        config = getattr(lora.base_model(model), "config", None)
        if config is not None:
            config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        old = directory.with_name(directory.name + ".old")
        if directory.exists():
            os.replace(directory, old)
        os.replace(staging, directory)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def save_adapter(model: Any, directory: Path, base: ModelSource | None) -> None:
    """A LoRA policy's adapter in PEFT's format, and the source of its base."""
    save_file(_untie(lora.adapter_state(model)), str(directory / ADAPTER_WEIGHTS))
    model.peft_config[lora.ADAPTER].save_pretrained(directory)
    if base is not None:
        (directory / BASE).write_text(base.model_dump_json(by_alias=True))


def save_weights(module: torch.nn.Module, path: Path) -> None:
    """`module`'s weights as one safetensors file, tied ones stored apart (`_untie`)."""
    weights = {k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}
    save_file(_untie(weights), str(path))


def _untie(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses shared storage: store each tied name as its own copy."""
    seen: set[int] = set()
    out = {}
    for name, tensor in weights.items():
        ptr = tensor.data_ptr()
        out[name] = tensor.clone() if ptr in seen else tensor
        seen.add(ptr)
    return out


def load_reference(directory: Path) -> dict[str, torch.Tensor] | None:
    """The KL anchor saved with the last checkpoint, if it has one."""
    path = directory / REFERENCE
    return load_file(str(path)) if path.is_file() else None


def resume(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> TrainerState:
    """Load the last checkpoint if there is one; a new epoch either way after the first."""
    state = read_state(directory)
    if state is None:
        return TrainerState()
    adapter = (directory / ADAPTER_WEIGHTS).is_file()
    if adapter != lora.is_lora(model):
        held, now = ("an adapter", "not") if adapter else ("full weights", "now")
        raise ConfigError(
            f"the checkpoint in {directory} holds {held} and trainer.lora is {now} set: "
            "resume with the setting it was written with, or start in a new directory"
        )
    if adapter:
        lora.load_adapter_state(model, load_file(str(directory / ADAPTER_WEIGHTS)))
    else:
        model.load_state_dict(load_file(str(directory / WEIGHTS)), strict=False)
    optimizer.load_state_dict(torch.load(directory / OPTIMIZER, weights_only=True))
    log_resumed(directory, state)
    return state


def read_state(directory: Path) -> TrainerState | None:
    """The step, version and epoch of the checkpoint in `directory` (None: none), the epoch
    already the resumed trainer's (one more)."""
    if not (directory / STATE).is_file():
        return None
    state = TrainerState(**json.loads((directory / STATE).read_text()))
    state.epoch += 1
    return state


def log_resumed(directory: Path, state: TrainerState) -> None:
    log.info(
        "resumed from checkpoint: step %d, epoch %d (weight version %d) in %s",
        state.step, state.epoch, state.version, directory,
    )  # fmt: skip
