"""Reproducible figures for the codec's targets, as plain dicts (for `polyrl bench delta --json`).

Two measurements, because size and speed need different inputs:

- `training_deltas`: size on *real* deltas. A tiny Llama (transformers' `LlamaConfig`) is trained
  on random tokens with fp32 master weights and Adam; after every step the weights are cast to
  bf16, and consecutive bf16 snapshots are diffed and encoded, exactly as a trainer publishes them.
  Which elements change depends on the optimiser and the weights' magnitudes (a bf16 element
  changes when its fp32 master crosses a rounding boundary), which synthetic data would not show.
- `synthetic_speed`: time on a large state dict (hundreds of MiB of bf16) with a given fraction of
  elements nudged by one unit in the last place, against a plain `dst.copy_(src)` of the same
  tensors. Each timing is the best of several interleaved repeats, so a busy machine slows all
  three alike.

Reference points: COO costs 6 bytes per changed element (u32 index + bf16 value); a full bf16
snapshot costs 2 bytes per element.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from polyrl.workers.deltas import decode, encode, format
from polyrl.workers.deltas.encoders import Encoder

COO_BYTES = 6

State = dict[str, torch.Tensor]


def training_deltas(
    lr: float, steps: int = 12, hidden: int = 128, layers: int = 4, vocab: int = 512, seed: int = 0
) -> dict[str, Any]:
    """Delta sizes over `steps` Adam steps at `lr`; the first steps are Adam's warm-up."""
    snapshots = _train_snapshots(lr, steps, hidden, layers, vocab, seed)
    per_step = [
        _delta_figures(old, new, version)
        for version, (old, new) in enumerate(itertools.pairwise(snapshots))
    ]
    later = per_step[len(per_step) // 2 :]  # past the first steps, where Adam's moments settle
    params = _numel(snapshots[0])
    changed = sum(step["changed"] for step in later)
    size = sum(step["bytes"] for step in later)
    return {
        "lr": lr,
        "model": {
            "hidden": hidden,
            "layers": layers,
            "vocab": vocab,
            "params": params,
        },
        "steps": per_step,
        "later_steps": {
            "changed_fraction": changed / (params * len(later)),
            "bytes_per_changed": size / changed,
            "vs_coo": COO_BYTES * changed / size,
            "vs_full_bf16": 2 * params * len(later) / size,
        },
    }


def synthetic_speed(
    total_mib: int = 256,
    change_rate: float = 0.01,
    tensors: int = 16,
    repeats: int = 5,
    threads: int | None = None,
) -> dict[str, Any]:
    """Encode and apply (with verification) times against `copy_`, on bf16 tensors.

    `threads` sets torch's thread count (used by `copy_`) and the codec's for the measurement.
    """
    with _torch_threads(threads) as count:
        figures = _speed(*_synthetic_states(total_mib, change_rate, tensors), repeats)
    return {"mib": total_mib, "change_rate": change_rate, "threads": count, **figures}


@contextlib.contextmanager
def _torch_threads(count: int | None) -> Iterator[int]:
    """torch's thread count set to `count` (None: left as it is) for a measurement, then back."""
    saved = torch.get_num_threads()
    torch.set_num_threads(count or saved)
    try:
        yield count or saved
    finally:
        torch.set_num_threads(saved)


def _speed(old: State, new: State, repeats: int) -> dict[str, Any]:
    blob = encode.encode_delta(old, new, base_version=0, new_version=1)
    target = {name: tensor.clone() for name, tensor in old.items()}
    scratch = {name: torch.empty_like(tensor) for name, tensor in new.items()}

    def encode_once() -> None:
        encode.encode_delta(old, new, base_version=0, new_version=1)

    def apply_once() -> None:
        decode.apply_delta(target, blob, have_version=0)

    copy_s = encode_s = apply_s = math.inf
    for _ in range(repeats):
        copy_s = min(copy_s, _timed(lambda: _copy(scratch, new)))
        encode_s = min(encode_s, _timed(encode_once))
        _copy(target, old)
        apply_s = min(apply_s, _timed(apply_once))
    if not all(torch.equal(target[k].view(torch.int16), new[k].view(torch.int16)) for k in new):
        raise AssertionError("applied weights differ from the encoded ones")
    changed = sum(t.count for t in format.read_header(blob).tensors)
    return {
        "bytes_per_changed": len(blob) / changed,
        "copy_s": copy_s,
        "encode_s": encode_s,
        "apply_s": apply_s,
        "encode_vs_copy": encode_s / copy_s,
        "apply_vs_copy": apply_s / copy_s,
    }


def _delta_figures(old: State, new: State, version: int) -> dict[str, Any]:
    blob = encode.encode_delta(old, new, base_version=version, new_version=version + 1)
    target = {name: tensor.clone() for name, tensor in old.items()}
    decode.apply_delta(target, blob, have_version=version)
    identical = all(torch.equal(target[k].view(torch.int16), new[k].view(torch.int16)) for k in new)
    header = format.read_header(blob)
    changed = sum(t.count for t in header.tensors if t.kind is format.Kind.SPARSE)
    return {
        "changed": changed,
        "changed_fraction": changed / _numel(new),
        "bytes": len(blob),
        "bytes_per_changed": len(blob) / changed if changed else None,
        "whole_tensors": sum(t.kind is format.Kind.WHOLE for t in header.tensors),
        "bit_identical": identical,
    }


def _training_model(hidden: int, layers: int, vocab: int) -> Any:
    """The small Llama whose training steps the benchmark diffs and times."""
    from transformers import LlamaConfig, LlamaForCausalLM  # only the benchmark needs it

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=vocab,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config)  # type: ignore[no-untyped-call]


def _train_snapshots(
    lr: float, steps: int, hidden: int, layers: int, vocab: int, seed: int
) -> list[State]:
    torch.manual_seed(seed)
    model = _training_model(hidden, layers, vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    snapshots = [_bf16(model)]
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (8, 64))
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        snapshots.append(_bf16(model))
    return snapshots


def _synthetic_states(total_mib: int, change_rate: float, tensors: int) -> tuple[State, State]:
    generator = torch.Generator().manual_seed(0)
    numel = total_mib * (1 << 20) // 2 // tensors
    old, new = {}, {}
    for i in range(tensors):
        weights = (torch.randn(numel, generator=generator) * 0.02).to(torch.bfloat16)
        nudged = weights.clone()
        flat = nudged.view(torch.int16)
        mask = torch.rand(numel, generator=generator) < change_rate
        signs = torch.randint(0, 2, (int(mask.sum()),), generator=generator, dtype=torch.int16)
        flat[mask] += signs * 2 - 1
        old[f"layers.{i}.weight"], new[f"layers.{i}.weight"] = weights, nudged
    return old, new


def _bf16(model: torch.nn.Module) -> State:
    return {name: t.detach().to(torch.bfloat16).clone() for name, t in model.state_dict().items()}


def _copy(dst: State, src: State) -> None:
    for name, tensor in src.items():
        dst[name].copy_(tensor)


def _timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _numel(state: State) -> int:
    return sum(t.numel() for t in state.values())


def encode_overhead(
    encoder: Encoder,
    steps: int = 10,
    hidden: int = 128,
    layers: int = 4,
    vocab: int = 512,
    seed: int = 0,
    train_threads: int | None = None,
    lr: float = 1e-6,
) -> dict[str, float]:
    """What encoding a version's delta adds to a training step when it runs beside it.

    The trainer encodes version N while it trains step N+1 (DESIGN: off the critical path); on
    a machine with few cores the two still share the CPU. This times training steps of the tiny
    model alone and with the previous step's delta being encoded at the same time, interleaved,
    and reports the medians and their ratio. `encoder` is where the encode runs: a
    `ProcessEncoder`, as the trainer does, or an `InlineEncoder`, run on a thread of this process
    (it shares the GIL with the step; see `encoders`); the caller closes it, and may reuse a
    child for several measurements (one takes seconds to start).
    `train_threads` is torch's intra-op thread count for the steps (default: unchanged). It
    matters: with every core in torch's pool, its threads wait for each other whenever the
    encode takes one core (measured on 2 cores with the thread encoder: +21-23 % against +4-6 %
    with one training thread; a busy loop on the second core alone: +350 % against +3 %).
    `lr` sets how much of the model changes per step (Adam; 1.3 % at 1e-6, 9 % at 1e-5).
    """
    with _torch_threads(train_threads) as count:
        figures = _encode_beside_steps(encoder, steps, hidden, layers, vocab, seed, lr)
    return {**figures, "train_threads": count}


def _encode_beside_steps(
    encoder: Encoder, steps: int, hidden: int, layers: int, vocab: int, seed: int, lr: float
) -> dict[str, float]:
    torch.manual_seed(seed)
    model = _training_model(hidden, layers, vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def train_step() -> float:
        tokens = torch.randint(0, vocab, (8, 64))
        started = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return time.perf_counter() - started

    train_step()  # warm-up: allocator, Adam state
    published = encoder.snapshot(_bf16(model), keep=None)
    encoder.keyframe(published, version=0)  # and the encoder's: a child's imports, its pool
    alone, beside, encode_times = [], [], []
    for version in range(1, steps + 1):
        alone.append(train_step())
        current = encoder.snapshot(_bf16(model), keep=published)

        def encode_delta(old: State = published, new: State = current, at: int = version) -> None:
            started = time.perf_counter()
            encoder.delta(old, new, base_version=at - 1, new_version=at)
            encode_times.append(time.perf_counter() - started)

        worker = threading.Thread(target=encode_delta)
        worker.start()
        beside.append(train_step())
        worker.join()
        published = encoder.snapshot(_bf16(model), keep=current)  # the next delta: one step
    step_alone, step_beside = statistics.median(alone), statistics.median(beside)
    return {
        "step_s": step_alone,
        "step_with_encode_s": step_beside,
        "encode_s": statistics.median(encode_times),
        "overhead": step_beside / step_alone - 1,
    }
