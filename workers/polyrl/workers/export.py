"""`polyrl export`: a trained policy as a Hugging Face directory other tools load as is.

A trainer checkpoint (`checkpoint.py`) already holds the weights, the model's config and the
tokenizer; exporting adds nothing but a clean copy without optimizer state, in the dtype asked
for, written atomically (a half-written export never looks finished). The source may be the
checkpoint directory itself or a `polyrl run` run directory, where the policy's checkpoint is
found by name.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from polyrl.workers import checkpoint
from polyrl.workers import model as models

DTYPES = ("bfloat16", "float16", "float32")


class ExportError(Exception):
    """The source holds no usable checkpoint, or the policy is ambiguous or unknown."""


def find_checkpoint(source: Path, policy: str | None) -> Path:
    """The checkpoint directory `source` names: itself, or one of a run directory's."""
    if (source / checkpoint.STATE).is_file():
        return source
    if not source.is_dir():
        raise ExportError(f"{source}: no such directory")
    found = {
        path.parent.parent.name: path.parent
        for path in sorted(source.glob(f"**/checkpoint/{checkpoint.STATE}"))
    }
    if not found:
        raise ExportError(f"{source}: no trainer checkpoint in it (looked for */checkpoint/)")
    if policy is None:
        if len(found) > 1:
            raise ExportError(
                f"{source} has several policies, pick one with --policy: {sorted(found)}"
            )
        return next(iter(found.values()))
    if policy not in found:
        raise ExportError(f"{source}: no checkpoint of policy {policy!r}; it has {sorted(found)}")
    return found[policy]


def export_checkpoint(directory: Path, out_dir: Path, *, dtype: str = "bfloat16") -> Path:
    """Write the checkpoint in `directory` as an HF directory at `out_dir` (must not exist)."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not (directory / "config.json").is_file():
        raise ExportError(
            f"{directory}: the checkpoint has no config.json (written by an older polyrl?)"
        )
    if out_dir.exists():
        raise ExportError(f"{out_dir} already exists; choose a new output directory")
    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=getattr(torch, dtype), local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        models.export(model, tokenizer, staging)
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
