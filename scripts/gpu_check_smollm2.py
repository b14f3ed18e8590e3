"""SmolLM2-135M-Instruct's shape on a GPU: engine-trainer agreement and one GRPO step's time.

Builds a model of SmolLM2's configuration (30 layers, hidden 576, 9 query and 3 KV heads,
a 49,152-token vocabulary, tied embeddings) with seeded random weights, or loads the real
model when `--model` names its directory (`polyrl models fetch --dequantize` prints it).
Then, on the device:

1. the torch engine samples in bfloat16 (what rollouts serve) and a float32 trainer copy
   scores the same tokens: the importance weights exp(trainer - engine) must stay near 1
   (mean |w - 1| <= 0.05, under 1 % above 2), as the CPU tests require of smaller models;
2. one GRPO step of the trainer's loss (`decoupled_ppo_loss`) on `--prompts` x `--group` samples of
   `--prompt-tokens` + `--new-tokens` tokens, forward, backward and AdamW, is timed after a
   warm-up step, with the peak memory it took.

Needs torch and transformers only (no pydantic, NATS or vLLM). Under 5 minutes on one GPU:

    python scripts/gpu_check_smollm2.py                      # random weights, SmolLM2's shape
    python scripts/gpu_check_smollm2.py --model DIR          # the real weights
    python scripts/gpu_check_smollm2.py --device cpu --layers 2 --prompts 2   # a quick try here

Prints one JSON object; exits 1 when the agreement check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, PreTrainedModel

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("operator", "workers")]

from polyrl.workers.models import shapes  # noqa: E402
from polyrl.workers.rollout.engines.base import SamplingParams  # noqa: E402
from polyrl.workers.rollout.engines.torch_engine import TorchEngine  # noqa: E402
from polyrl.workers.trainer.batching import token_logprobs  # noqa: E402
from polyrl.workers.trainer.objectives.ppo import decoupled_ppo_loss  # noqa: E402

VOCAB = shapes.SMOLLM2_VOCAB


def build(args: argparse.Namespace, dtype: torch.dtype) -> PreTrainedModel:
    if args.model is not None:
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
        return model
    torch.manual_seed(0)
    built = LlamaForCausalLM(shapes.smollm2_135m(args.layers))  # type: ignore[no-untyped-call]
    torch.nn.Module.to(built, dtype=dtype)  # nn.Module's own `to`: transformers' confuses mypy
    return built


def agreement(args: argparse.Namespace, trainer: PreTrainedModel) -> dict[str, float]:
    """Importance weights of bfloat16 engine samples under the float32 trainer."""
    engine = TorchEngine(build(args, torch.bfloat16), device=args.device)
    prompts = [
        [(37 * row + 11 * i) % VOCAB for i in range(args.prompt_tokens)] for row in range(32)
    ]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=args.new_tokens, seed=0))
    weights = []
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt + out.tokens], device=args.device)
        with torch.no_grad():
            logp = trainer(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
        picked = logp[len(prompt) - 1 :].gather(-1, ids[0, len(prompt) :, None])[:, 0]
        weights.append((picked.double().cpu() - torch.tensor(out.logprobs).double()).exp())
    w = torch.cat(weights)
    return {
        "is_weight_mean_abs_dev": float((w - 1).abs().mean()),
        "is_weight_above_2_frac": float((w > 2.0).double().mean()),
        "tokens_compared": int(w.numel()),
    }


def grpo_step_seconds(args: argparse.Namespace, trainer: PreTrainedModel) -> dict[str, float]:
    """Seconds of one GRPO step (forward, backward, AdamW) after a warm-up step."""
    rows, length = args.prompts * args.group, args.prompt_tokens + args.new_tokens
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (rows, length), generator=generator).to(args.device)
    mask = torch.zeros(rows, length, dtype=torch.bool, device=args.device)
    mask[:, args.prompt_tokens :] = True
    advantages = torch.randn(rows, 1, generator=generator).to(args.device).expand(rows, length)
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=1e-6)
    trainer.train()
    times = []
    for _ in range(2):
        _sync(args.device)
        started = time.perf_counter()
        logits = trainer(input_ids=ids).logits
        new = token_logprobs(logits, ids, mask, 1.0)
        old = new.detach()
        loss, _ = decoupled_ppo_loss(
            new, old, advantages * mask, mask, clip_low=0.2, clip_high=0.28, tis_cap=2.0
        )
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(args.device)
        times.append(time.perf_counter() - started)
    torch.nn.Module.eval(trainer)
    figures = {"grpo_step_s": times[-1], "grpo_step_rows": rows, "grpo_step_tokens": rows * length}
    if args.device.startswith("cuda"):
        figures["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return figures


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a SmolLM2 directory (default: random weights)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=30, help="layers of the random model")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per GRPO step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    started = time.perf_counter()
    trainer = build(args, torch.float32)
    torch.nn.Module.to(trainer, device=args.device)
    torch.nn.Module.eval(trainer)
    figures: dict[str, object] = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "model": str(args.model or f"random SmolLM2 shape, {args.layers} layers"),
        "parameters_m": sum(p.numel() for p in trainer.parameters()) / 1e6,
    }
    agreed = agreement(args, trainer)
    figures |= agreed
    figures |= grpo_step_seconds(args, trainer)
    figures["total_s"] = time.perf_counter() - started
    print(json.dumps(figures, sort_keys=True))
    ok = agreed["is_weight_mean_abs_dev"] <= 0.05 and agreed["is_weight_above_2_frac"] <= 0.01
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
