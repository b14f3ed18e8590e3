"""The vLLM engine's host copy of a checkpoint directory names what the trainer names."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from polyrl.workers.rollout.engines import vllm_engine


def _directory(tmp_path: Path, *, tied: bool) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
    save_file({"model.embed_tokens.weight": torch.ones(4, 2)}, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_a_tied_head_left_out_of_the_safetensors_shares_the_embeddings_memory(
    tmp_path: Path,
) -> None:
    _, state = vllm_engine._checkpoint(str(_directory(tmp_path, tied=True)), tmp_path)
    assert set(state) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()


def test_an_untied_checkpoint_keeps_only_what_it_holds(tmp_path: Path) -> None:
    _, state = vllm_engine._checkpoint(str(_directory(tmp_path, tied=False)), tmp_path)
    assert set(state) == {"model.embed_tokens.weight"}
