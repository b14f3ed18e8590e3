"""SmolLM2-135M-Instruct served by vLLM (`vllm`: run by `make test-vllm` in `.venv-vllm`).

The rollout worker's update path on the real model: a keyframe and then RL-sized deltas
(a few percent of the bfloat16 elements move), applied to the host state and pushed into
vLLM. What vLLM then serves must be what a vLLM engine loaded afresh from the same weights
serves (greedy ids equal, log-probs within the contract's 1e-6 of each other); and an update
of one token's embedding row alone must reach both the embedding and the output head, which
SmolLM2 ties: the log-prob of that token as the next one changes, as it does in a fresh load.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from polyrl.workers.deltas.decode import apply_delta
from polyrl.workers.deltas.encode import encode_delta, encode_keyframe
from polyrl.workers.rollout import engines
from polyrl.workers.rollout.engines.base import Engine, SamplingParams

pytestmark = pytest.mark.vllm

PROMPTS = [[1, 4093, 198, 30, 1232, 216, 34, 446, 2, 198, 1, 520, 9531, 198]] * 2 + [
    [1, 4093, 198, 1780, 314, 216, 33, 40, 1232, 216, 36, 38, 47, 2, 198, 1, 520, 9531, 198]
]
ALIVE: list[Engine] = []  # vLLM engines live until the module ends (see the contract suite)


def _vllm(directory: Path) -> Engine:
    engine = engines.make_engine("vllm", str(directory), max_batch_size=8, max_model_len=256)
    ALIVE.append(engine)
    return engine


def _served(engine: Engine) -> tuple[list[list[int]], torch.Tensor]:
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0))
    return [r.tokens for r in results], torch.tensor([r.logprobs for r in results])


def _step(state: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    new = {}
    for name, tensor in state.items():
        moved = torch.rand(tensor.shape, generator=gen) < 0.02
        nudged = tensor.float() * (1 + 0.05 * torch.randn(tensor.shape, generator=gen))
        new[name] = torch.where(moved, nudged, tensor.float()).to(tensor.dtype)
    new["lm_head.weight"] = new["model.embed_tokens.weight"].clone()  # tied, as trained
    return new


def _save(state: dict[str, torch.Tensor], smollm2: Path, out: Path) -> Path:
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.bfloat16)
    model.load_state_dict(state)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((smollm2 / name).read_bytes())
    return out


def test_vllm_serves_smollm2_after_deltas_as_a_fresh_load_and_follows_its_tied_head(
    smollm2: Path, tmp_path: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.bfloat16)
    trainer = {name: t.clone() for name, t in model.state_dict().items()}
    replica = {name: t.clone() for name, t in trainer.items()}
    engine = _vllm(_save(trainer, smollm2, tmp_path / "v0"))
    gen = torch.Generator().manual_seed(0)
    for version in range(1, 4):  # a keyframe, then two deltas
        new = _step(trainer, gen)
        blob = (
            encode_keyframe(new, version=version)
            if version == 1
            else encode_delta(trainer, new, base_version=version - 1, new_version=version)
        )
        apply_delta(replica, blob, have_version=version - 1)
        engine.load_weights(replica)
        trainer = new
    tokens, logprobs = _served(engine)
    fresh_tokens, fresh_logprobs = _served(_vllm(_save(trainer, smollm2, tmp_path / "v3")))
    assert tokens == fresh_tokens
    torch.testing.assert_close(logprobs, fresh_logprobs, atol=1e-6, rtol=0)
    # One row of the tied embedding, the first greedy token of the first prompt: only the
    # head (scoring it) and the embedding (reading it back) see it.
    row = tokens[0][0]
    tied = {name: t.clone() for name, t in trainer.items()}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tied[name][row] = (tied[name][row].float() * 0.5).to(torch.bfloat16)
    apply_delta(replica, encode_delta(trainer, tied, base_version=3, new_version=4), have_version=3)
    engine.load_weights(replica)
    moved_tokens, moved = _served(engine)
    assert moved[0, 0] != logprobs[0, 0]  # the head scores the row's token differently
    fresh = _served(_vllm(_save(tied, smollm2, tmp_path / "v4")))
    assert moved_tokens == fresh[0]
    torch.testing.assert_close(moved, fresh[1], atol=1e-6, rtol=0)
