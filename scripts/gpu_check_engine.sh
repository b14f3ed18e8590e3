#!/usr/bin/env bash
# Device check for the generation engines (workers/polyrl/workers/rollout/engines): the `gpu`-marked
# engine tests on CUDA (among them a BPE Qwen2's bfloat16 log-prob agreement with a float32
# trainer and a sparse delta reaching its CUDA weights bit for bit), then decode throughput of
# the torch engine, CPU against CUDA, on a model somewhat larger than the tests' tiny one, and
# SmolLM2-135M's shape: engine-trainer agreement and one GRPO step (gpu_check_smollm2.py).
# Needs torch, transformers, tokenizers, pydantic and zstandard (the tests import the wire models
# and the delta codec), and pytest for the tests; installs nothing. Run from anywhere on a CUDA
# machine:
#
#     bash scripts/gpu_check_engine.sh          # PYTHON=/path/to/python to pick an interpreter
#
# Exit status: that of the tests (1 if pytest is missing); throughput is informational.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="operator:workers${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"

"$PY" -c 'import torch, transformers
print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"cuda: {torch.cuda.get_device_name() if torch.cuda.is_available() else None}")'

status=0
if "$PY" -c 'import pytest' 2>/dev/null; then
    # --noconftest: tests/conftest.py sets up cluster services and imports kubernetes, which a GPU
    # image may lack; the engine tests use none of it, and with CUDA present nothing is skipped.
    # Plugins pyproject.toml configures (asyncio, timeout) may be absent: their options only warn.
    "$PY" -m pytest tests/unit/workers/engines -q -m gpu -p no:cacheprovider --noconftest \
        -W ignore::pytest.PytestConfigWarning || status=$?
else
    echo "pytest is not installed here: the engine tests were not run" >&2
    status=1
fi

"$PY" - <<'PYTHON'
"""Decode tokens/s of TorchEngine: CPU float32 against CUDA float32 and bfloat16."""
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from polyrl.workers.rollout.engines.base import SamplingParams
from polyrl.workers.rollout.engines.torch_engine import TorchEngine

CONFIG = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
PROMPT_TOKENS, NEW_TOKENS = 32, 64


def model(dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).to(dtype)


def tokens_per_second(device: str, dtype: torch.dtype, batch: int) -> float:
    engine = TorchEngine(model(dtype), device=device, max_batch_size=batch)
    prompts = [[(7 * row + i) % 32000 for i in range(PROMPT_TOKENS)] for row in range(batch)]
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, seed=0))  # warm-up
    started = time.perf_counter()
    results = engine.generate(prompts, params)  # returns host lists: the device has finished
    elapsed = time.perf_counter() - started
    return sum(len(r.tokens) for r in results) / elapsed


runs = [("cpu", torch.float32, 8)]  # small: a CPU decodes slowly, and device time is scarce
if torch.cuda.is_available():
    runs += [("cuda", torch.float32, 16), ("cuda", torch.bfloat16, 16), ("cuda", torch.bfloat16, 128)]
params = sum(p.numel() for p in model(torch.float32).parameters()) / 1e6
print(f"throughput: Llama {params:.0f}M params, {PROMPT_TOKENS}-token prompts, "
      f"{NEW_TOKENS} new tokens, temperature 1")
for device, dtype, batch in runs:
    rate = tokens_per_second(device, dtype, batch)
    print(f"  {device:4} {str(dtype).removeprefix('torch.'):8} batch {batch:3}: {rate:9.0f} tokens/s")
PYTHON

# SmolLM2-135M-Instruct's shape (random weights; the real file stays on the CPU machine):
# bfloat16 engine against float32 trainer, and one GRPO step's time (scripts/gpu_check_smollm2.py).
"$PY" scripts/gpu_check_smollm2.py || status=$?

exit "$status"
