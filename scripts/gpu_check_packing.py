"""Packed micro-batches on a GPU: the padded path's log-probs and gradients, and the speed.

`trainer.microBatchTokens` runs a micro-batch as one row, its samples end to end with position
ids from 0 each, and relies on transformers building a block-diagonal causal mask from them
(`workers/polyrl/workers/trainer/packing.py`). The CPU tests prove it with CPU kernels; CUDA's
scaled-dot-product attention picks other kernels, and a mask changes which, so this checks:

1. equality on the Llama, Qwen2 and Qwen3 test models (`tinybpe`) on the device: log-probs and
   every gradient of the packed path against the padded path's, within 1e-9 in float64 and
   1e-4 in float32 (bfloat16's difference is reported: both paths round, differently), and
   that one causal row without the restarting position ids differs (the check can fail);
2. speed on SmolLM2-135M's shape (random weights): forward and backward of a batch with
   log-normal completion lengths, padded micro-batches of `--rows` samples against packed
   ones of about as many real tokens, in bfloat16 and float32: real tokens per second of the
   median of `--steps` timed steps after a warm-up, and peak device memory.

Needs torch, transformers and tokenizers only. Prints one JSON object; exits 1 when an
equality check fails.

    python scripts/gpu_check_packing.py                                       # CUDA
    python scripts/gpu_check_packing.py --device cpu --layers 2 --samples 16 --steps 1
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("operator", "workers")]

from polyrl.workers.models import shapes, tinybpe  # noqa: E402
from polyrl.workers.trainer import batching, packing  # noqa: E402

Logprobs = Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


def long_tailed(
    vocab: int, count: int, prompt: int, median: int, cap: int, seed: int = 0
) -> list[batching.Sample]:
    """`count` samples: prompts of 2..`prompt` tokens, log-normal completions capped at `cap`,
    every third with a shown (untrained) stretch, as multi-turn samples have."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = max(1, min(cap, round(rng.lognormvariate(math.log(median), 1.0))))
        ids = [rng.randrange(3, vocab) for _ in range(rng.randint(2, prompt) + n)]
        mask = [j % 5 != 2 for j in range(n)] if i % 3 == 0 and n > 2 else None
        out.append(
            batching.Sample(
                ids[:-n], ids[-n:], [-1.0] * n, float(i % 2), f"g{i // 4}", 0,
                completion_mask=mask,
            )
        )  # fmt: skip
    return out


def step(model: Any, batch: batching.Batch, logprobs: Logprobs) -> torch.Tensor:
    """Log-probs of `batch` and a backward of a loss weighting each token by its row."""
    device = next(iter(model.parameters())).device
    tensors = (batch.input_ids, batch.attention_mask, batch.loss_mask)
    ids, attention, mask = (t.to(device) for t in tensors)
    new = logprobs(model, ids, attention, mask, 0.7)
    weights = torch.linspace(-1.0, 1.0, new.shape[0], device=device, dtype=new.dtype)
    (new * weights[:, None]).sum().div(mask.sum()).backward()  # type: ignore[no-untyped-call]
    return new.detach()


def compare(model: Any, batch: batching.Batch) -> dict[str, float]:
    """Largest differences, packed against padded: log-probs and any gradient element."""
    got = []
    for logprobs in (batching.completion_logprobs, packing.packed_logprobs):
        model.zero_grad()
        new = step(model, batch, logprobs)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        got.append((new, grads))
    (padded, padded_grads), (packed, packed_grads) = got
    if padded_grads.keys() != packed_grads.keys():
        raise AssertionError("the two paths gave gradients to different parameters")
    return {
        "logprobs": (padded - packed).abs().max().item(),
        "gradients": max((g - packed_grads[n]).abs().max().item() for n, g in padded_grads.items()),
    }


def joined_differs(model: Any, batch: batching.Batch) -> float:
    """How far a causal row over the same tokens, positions counting on, moves the second
    sample's logits: what the restarting position ids prevent."""
    device = next(iter(model.parameters())).device
    rows, cols = batch.attention_mask[:2].bool().nonzero(as_tuple=True)
    ids = batch.input_ids[rows, cols].unsqueeze(0).to(device)
    first = int(batch.attention_mask[0].sum())
    with torch.no_grad():
        joined = model(input_ids=ids, use_cache=False).logits[0, first:]
        blocked = model(input_ids=ids, position_ids=cols[None].to(device), use_cache=False)
    return float((joined - blocked.logits[0, first:]).abs().max().item())


def equality(device: str, scratch: Path) -> tuple[dict[str, Any], list[str]]:
    figures: dict[str, Any] = {}
    failures = []
    for arch in tinybpe.ARCHITECTURES:
        path = tinybpe.ensure(f"{tinybpe.SCHEME}{arch}/gpu", scratch)
        for dtype in (torch.float64, torch.float32, torch.bfloat16):
            model: Any = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation="sdpa"
            )
            torch.nn.Module.eval(torch.nn.Module.to(model, device))
            vocab = int(model.config.vocab_size)
            batch = batching.collate(long_tailed(vocab, 12, 9, 8, 40), pad_id=0)
            name = f"{arch}_{str(dtype).removeprefix('torch.')}"
            figures[name] = diff = compare(model, batch)
            bound = TOLERANCE.get(dtype)
            if bound is not None and max(diff.values()) > bound:
                failures.append(f"{name}: {diff} over {bound}")
            if dtype == torch.float64:
                figures[f"{arch}_joined_row_differs_by"] = moved = joined_differs(model, batch)
                if moved < 1e-3:
                    failures.append(f"{arch}: a joined row did not differ ({moved})")
    return figures, failures


def timed(
    model: Any, plan: packing.Plan, samples: list[batching.Sample], packed: bool, steps: int
) -> tuple[float, float | None]:
    """Median seconds of a step over the plan's micro-batches, and the peak memory it took."""
    logprobs = packing.packed_logprobs if packed else batching.completion_logprobs
    batches = [batching.collate([samples[i] for i in rows], pad_id=0) for rows in plan]
    cuda = torch.cuda.is_available() and next(iter(model.parameters())).is_cuda
    seconds = []
    for attempt in range(steps + 1):  # the first warms up kernels and the allocator
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        for batch in batches:
            step(model, batch, logprobs)
        if cuda:
            torch.cuda.synchronize()
        if attempt:
            seconds.append(time.perf_counter() - started)
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None
    return statistics.median(seconds), peak


def speed(device: str, args: argparse.Namespace) -> dict[str, Any]:
    samples = long_tailed(49152, args.samples, 64, args.median, args.cap)
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    real = sum(lengths)
    rows = packing.by_rows(len(samples), args.rows)
    padded_cells = sum(len(r) * max(lengths[i] for i in r) for r in rows)
    tokens = packing.by_tokens(lengths, round(args.rows * real / len(samples)))
    figures: dict[str, Any] = {
        "samples": len(samples), "real_tokens": real, "longest": max(lengths),
        "padding_share_if_padded": round(1 - real / padded_cells, 3),
        "micro_batches": {"padded": len(rows), "packed": len(tokens)},
    }  # fmt: skip
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        model: Any = LlamaForCausalLM(shapes.smollm2_135m(args.layers))  # type: ignore[no-untyped-call]
        torch.nn.Module.to(model, device=device, dtype=dtype)
        name = str(dtype).removeprefix("torch.")
        if dtype == torch.float32:  # the bound the learning target checks on the real weights
            figures["float32_equality"] = compare(model, batching.collate(samples[:8], 0))
        got = {
            mode: timed(model, plan, samples, mode == "packed", args.steps)
            for mode, plan in (("padded", rows), ("packed", tokens))
        }
        for mode, (seconds, peak) in got.items():
            figures[f"{name}_{mode}_tokens_per_second"] = round(real / seconds)
            figures[f"{name}_{mode}_peak_gb"] = peak
        ratio = got["padded"][0] / got["packed"][0]
        figures[f"{name}_packed_vs_padded_tokens_per_second"] = round(ratio, 3)
        del model
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2: 30)")
    parser.add_argument("--samples", type=int, default=256, help="samples in the timed batch")
    parser.add_argument("--median", type=int, default=64, help="median completion tokens")
    parser.add_argument("--cap", type=int, default=1024, help="longest completion")
    parser.add_argument("--rows", type=int, default=16, help="samples per padded micro-batch")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up")
    args = parser.parse_args()
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    with tempfile.TemporaryDirectory(prefix="polyrl-gpu-packing-") as scratch:
        equal, failures = equality(args.device, Path(scratch))
    figures = {"device": name, "torch": torch.__version__, "equality": equal}
    figures["speed"] = fast = speed(args.device, args)
    if max(fast["float32_equality"].values()) > TOLERANCE[torch.float32]:
        failures.append(f"SmolLM2's shape, float32: {fast['float32_equality']}")
    figures["failures"] = failures
    print(json.dumps(figures, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
