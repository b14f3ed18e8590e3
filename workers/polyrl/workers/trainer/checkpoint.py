"""Trainer checkpoints: weights (safetensors), optimizer state, step, version and epoch.

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

log = logging.getLogger("polyrl.trainer")
STATE = "trainer.json"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
REFERENCE = "reference.safetensors"  # the KL anchor, when the trainer has one


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
) -> None:
    """Write the checkpoint; with the model's config and `tokenizer` it is also an HF directory.

    The config and tokenizer make a checkpoint self-describing: `polyrl export` (and
    `AutoModelForCausalLM.from_pretrained`) need nothing but the directory.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".ckpt.", dir=directory.parent))
    try:
        save_weights(model, staging / WEIGHTS)
        torch.save(optimizer.state_dict(), staging / OPTIMIZER)
        if reference is not None:
            save_weights(reference, staging / REFERENCE)
        (staging / STATE).write_text(json.dumps(asdict(state)))
        config = getattr(model, "config", None)
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
    if not (directory / STATE).is_file():
        return TrainerState()
    state = TrainerState(**json.loads((directory / STATE).read_text()))
    model.load_state_dict(load_file(str(directory / WEIGHTS)), strict=False)
    optimizer.load_state_dict(torch.load(directory / OPTIMIZER, weights_only=True))
    state.epoch += 1
    log.info(
        "resumed from checkpoint: step %d, epoch %d (weight version %d) in %s",
        state.step, state.epoch, state.version, directory,
    )  # fmt: skip
    return state
