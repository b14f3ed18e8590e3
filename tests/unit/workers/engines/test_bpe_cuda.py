"""A BPE Qwen2 on CUDA (`gpu`: run by scripts/gpu_check_engine.sh where a GPU is lent): the
bfloat16 engine's behaviour log-probs against the float32 trainer's, and a sparse delta
applied to the engine's host copy and pushed to its CUDA weights, bit for bit.

Needs torch, transformers and tokenizers only (the GPU image has no pydantic): the model is
built with `tinybpe`, which uses nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from polyrl.workers.models import tinybpe
from polyrl.workers.rollout.engines import torch_engine
from polyrl.workers.rollout.engines.base import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tinybpe.ensure(f"{tinybpe.SCHEME}qwen2/cuda", tmp_path_factory.mktemp("bpe"))


def test_bfloat16_on_cuda_leaves_step_zero_importance_weights_near_one(qwen: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen)
    trainer: torch.nn.Module = AutoModelForCausalLM.from_pretrained(qwen, dtype=torch.float32)
    trainer = torch.nn.Module.eval(trainer.to(torch.device("cuda")))
    served = AutoModelForCausalLM.from_pretrained(qwen, dtype=torch.bfloat16)
    engine = torch_engine.TorchEngine(served, device="cuda")
    prompts = [tokenizer(f"{a}+{a + 3}=")["input_ids"] for a in range(32)]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=12, seed=0))
    ratios = []
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt + out.tokens], device="cuda")
        with torch.no_grad():
            logp = trainer(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
        picked = logp[len(prompt) - 1 :].gather(-1, ids[0, len(prompt) :, None])[:, 0]
        ratios.append((picked.double().cpu() - torch.tensor(out.logprobs).double()).exp())
    weights = torch.cat(ratios)
    assert float((weights - 1).abs().mean()) <= 0.05
    assert float((weights > 2.0).double().mean()) <= 0.01


def test_a_sparse_delta_reaches_the_cuda_weights_bit_for_bit(qwen: Path) -> None:
    pytest.importorskip("zstandard", reason="the delta codec needs zstandard")
    pytest.importorskip("xxhash", reason="the delta codec needs xxhash")
    from polyrl.workers.deltas.decode import apply_delta
    from polyrl.workers.deltas.encode import encode_delta, encode_keyframe

    model = AutoModelForCausalLM.from_pretrained(qwen, dtype=torch.bfloat16)
    engine = torch_engine.TorchEngine(model, device="cuda")
    old = {k: v.clone() for k, v in engine.weights().items()}
    new = {k: v.clone() for k, v in old.items()}
    with torch.no_grad():
        for tensor in new.values():
            flat = tensor.view(-1)
            flat[::97] += 0.01  # about 1 % of the values change
    apply_delta(engine.weights(), encode_keyframe(old, version=0), have_version=None)
    apply_delta(
        engine.weights(), encode_delta(old, new, base_version=0, new_version=1), have_version=0
    )
    engine.load_weights(engine.weights())
    served = dict(engine.model.state_dict())
    for name, tensor in new.items():
        assert torch.equal(served[name].cpu().view(torch.int16), tensor.view(torch.int16)), name
