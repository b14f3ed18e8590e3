"""FSDP2 on one GPU (a 1-rank mesh) with SmolLM2-135M's shape: sharded steps against plain ones.

The trainer's sharding (`workers/polyrl/workers/trainer/sharding.py`: each decoder layer and
the root under `fully_shard`) from one seeded start, on the same batches, with the trainer's
objective (`policy_loss`, grpo's defaults), gradient clipping at 1.0 and AdamW:

1. float32: `--steps` steps of the plain model and of the sharded one: every step's loss and
   every weight after the last within 1e-5 (asserted; the two compute the same arithmetic);
2. bfloat16 mixed precision (`sharding.mixed_precision`: bf16 compute, float32 master weights
   and gradient reduction): median step time beside the plain float32 one, and how far its
   losses are from float32's (reported: it rounds).

Needs torch, transformers and pydantic. Prints one JSON object; exits 1 when the float32 check
fails. About a minute on one GPU:

    python scripts/gpu_check_fsdp2.py
    python scripts/gpu_check_fsdp2.py --device cpu --layers 2 --rows 4   # a quick try (gloo)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import LlamaForCausalLM

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("operator", "workers")]

from polyrl.api.resources import AlgorithmSpec  # noqa: E402
from polyrl.workers.models import shapes  # noqa: E402
from polyrl.workers.trainer import batching, sharding  # noqa: E402
from polyrl.workers.trainer.objectives import Normaliser, policy_loss  # noqa: E402

BOUND = 1e-5


def batches(args: argparse.Namespace) -> list[batching.Batch]:
    """One batch a step: `--rows` samples of 2..64 prompt and 8..`--completion` completion
    tokens, rewards alternating in groups of 4."""
    rng = random.Random(0)
    out = []
    for step in range(args.steps):
        samples = []
        for i in range(args.rows):
            n = rng.randint(8, args.completion)
            ids = [rng.randrange(3, shapes.SMOLLM2_VOCAB) for _ in range(rng.randint(2, 64) + n)]
            samples.append(
                batching.Sample(ids[:-n], ids[-n:], [-2.0] * n, float(i % 2), f"{step}-{i // 4}", 0)
            )
        out.append(batching.collate(batching.assign_advantages(samples), pad_id=0))
    return out


def behaviour(model: Any, data: list[batching.Batch], device: str) -> list[torch.Tensor]:
    """Each batch's log-probs under the start: the behaviour and proximal policy of every run,
    so that each step's loss depends on the weights it is computed with."""
    with torch.no_grad():
        return [
            batching.completion_logprobs(
                model, b.input_ids.to(device), b.attention_mask.to(device),
                b.loss_mask.to(device), 1.0,
            )
            for b in data
        ]  # fmt: skip


def train(
    model: Any, data: list[batching.Batch], old: list[torch.Tensor], device: str
) -> tuple[list[float], list[float]]:
    """The steps; each one's loss and seconds."""
    loss_spec = AlgorithmSpec().resolved_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    losses, seconds = [], []
    for batch, before in zip(data, old, strict=True):
        ids, attention, mask = (
            t.to(device) for t in (batch.input_ids, batch.attention_mask, batch.loss_mask)
        )
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        new = batching.completion_logprobs(model, ids, attention, mask, 1.0)
        value, _ = policy_loss(
            new, before, batch.advantages.to(device), mask, loss=loss_spec, prox=before,
            normaliser=Normaliser(tokens=float(mask.sum())),
        )  # fmt: skip
        value.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
        losses.append(float(value.detach().float().item()))
    return losses, seconds


def init(device: str) -> None:
    """A world of one: nccl on a GPU, gloo on CPU."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2: 30)")
    parser.add_argument("--rows", type=int, default=32, help="samples a step")
    parser.add_argument("--completion", type=int, default=128, help="longest completion")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    init(args.device)
    mesh = init_device_mesh(torch.device(args.device).type, (1,))
    torch.manual_seed(0)
    start: Any = LlamaForCausalLM(shapes.smollm2_135m(args.layers))  # type: ignore[no-untyped-call]
    torch.nn.Module.to(start, device=args.device, dtype=torch.float32)
    data = batches(args)
    plain = copy.deepcopy(start)
    fp32 = sharding.shard(copy.deepcopy(start), mesh, precision=sharding.mixed_precision("cpu"))
    mixed = sharding.shard(
        copy.deepcopy(start), mesh, precision=sharding.mixed_precision(mesh.device_type)
    )
    old = behaviour(start, data, args.device)
    plain_losses, plain_s = train(plain, data, old, args.device)
    fp32_losses, fp32_s = train(fp32, data, old, args.device)
    mixed_losses, mixed_s = train(mixed, data, old, args.device)
    sharded, master = sharding.full_state(fp32), sharding.full_state(mixed)
    weights = max((t - sharded[n]).abs().max().item() for n, t in plain.state_dict().items())
    drift = max((t - master[n]).abs().max().item() for n, t in plain.state_dict().items())
    losses = max(abs(a - b) for a, b in zip(plain_losses, fp32_losses, strict=True))
    figures = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "model": f"random SmolLM2 shape, {args.layers} layers",
        "steps": args.steps,
        "tokens_per_step": [int(b.attention_mask.sum()) for b in data],
        "float32_loss_max_abs_diff": losses,
        "float32_weight_max_abs_diff": weights,
        "plain_losses": plain_losses,
        "bf16_mixed_losses": mixed_losses,
        "bf16_mixed_loss_max_abs_diff_from_float32": max(
            abs(a - b) for a, b in zip(plain_losses, mixed_losses, strict=True)
        ),
        "bf16_mixed_weight_max_abs_diff_from_float32": drift,
        "plain_float32_step_s_median": statistics.median(plain_s[1:] or plain_s),
        "fsdp2_float32_step_s_median": statistics.median(fp32_s[1:] or fp32_s),
        "fsdp2_bf16_mixed_step_s_median": statistics.median(mixed_s[1:] or mixed_s),
        "ok": losses <= BOUND and weights <= BOUND,
    }
    print(json.dumps(figures, indent=1))
    dist.destroy_process_group()
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
