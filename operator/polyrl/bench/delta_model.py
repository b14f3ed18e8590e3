"""`polyrl bench delta --model DIR`: the delta figures on RL steps of a real model.

The built-in figures come from a tiny Llama trained on random tokens; a real pretrained model
trained by RL is what users will sync. So this runs GRPO steps on `DIR` in one process (the
trainer's default loss, `objectives.ppo`, and AdamW as the trainer uses them; rollouts sampled by the torch
engine serving the bfloat16 weights, refreshed after every step) on the arithmetic task asked
as chat questions (`TASK`), at each learning rate of `LEARNING_RATES`, and measures every step's
bfloat16 delta: the fraction of elements that changed, bytes per changed element, size
against the full bfloat16 model, encode and apply (verified) time against `copy_`, and that
the replica ends bit-identical. The last step at the first learning rate is then synced to
a replica over loopback and over the shaped link, new (keyframe) against one behind (delta).
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from polyrl.api.resources import TaskSpec
from polyrl.bench import measure
from polyrl.workers import tasks
from polyrl.workers.deltas import decode, encode, format
from polyrl.workers.rollout.engines.base import SamplingParams
from polyrl.workers.rollout.engines.torch_engine import TorchEngine
from polyrl.workers.trainer import batching
from polyrl.workers.trainer.objectives import ppo

LEARNING_RATES = (1e-6, 1e-5)
TASK = TaskSpec(
    name="arithmetic",
    params={
        "digits": 1,
        "template": "{left} + {right} =",
        "system": "Reply with only the number.",
        "match": "last-number",
    },
)
PROMPTS, GROUP, NEW_TOKENS, TEMPERATURE = 8, 8, 8, 1.0
State = dict[str, torch.Tensor]


def steps_figures(
    model_dir: Path, *, steps: int, progress: Any
) -> tuple[dict[str, Any], State, State]:
    """Per-lr medians over the steps, and the first lr's last (old, new) bf16 states."""
    figures: dict[str, Any] = {"model": str(model_dir), "rl_steps": steps}
    last: tuple[State, State] | None = None
    for index, lr in enumerate(LEARNING_RATES):
        progress(f"{steps} GRPO steps of {model_dir.name} at lr {lr}")
        snapshots, rewards = _rl_snapshots(model_dir, lr=lr, steps=steps)
        per_step = [
            _step_figures(old, new, v) for v, (old, new) in enumerate(itertools.pairwise(snapshots))
        ]
        suffix = "" if index == 0 else f"_lr{lr:.0e}".replace("-0", "")
        figures |= {
            f"{key}{suffix}": value for key, value in _summary(per_step, rewards, lr).items()
        }
        if last is None:
            last = snapshots[-2], snapshots[-1]
    assert last is not None
    return figures, *last


def _summary(per_step: list[dict[str, Any]], rewards: list[float], lr: float) -> dict[str, Any]:
    params = per_step[0]["params"]
    median = {
        k: statistics.median(s[k] for s in per_step)
        for k in ("changed_fraction", "bytes", "encode_s", "apply_s", "copy_s")
    }
    return {
        "lr": lr,
        "changed_fraction_per_step": [round(s["changed_fraction"], 5) for s in per_step],
        "changed_fraction": median["changed_fraction"],
        "bytes_per_changed_element": statistics.median(
            s["bytes"] / max(s["changed"], 1) for s in per_step
        ),
        "delta_vs_full_bf16": median["bytes"] / (2 * params),
        "encode_s": median["encode_s"],
        "apply_s": median["apply_s"],
        "copy_s": median["copy_s"],
        "encode_vs_copy": median["encode_s"] / median["copy_s"],
        "apply_vs_copy": median["apply_s"] / median["copy_s"],
        "bit_identical": all(s["bit_identical"] for s in per_step),
        "mean_reward_per_step": [round(r, 3) for r in rewards],
        "params": params,
    }


def _rl_snapshots(model_dir: Path, *, lr: float, steps: int) -> tuple[list[State], list[float]]:
    trainer: PreTrainedModel = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = TorchEngine(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16),
        max_batch_size=PROMPTS * GROUP,
    )
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=lr, weight_decay=0.0)
    task, rng = tasks.load_task(TASK), random.Random(0)
    snapshots, rewards = [measure._bf16(trainer)], []
    for step in range(steps):
        problems = [task.sample(rng) for _ in range(PROMPTS)]
        prompts = [_encode(tokenizer, p.request) for p in problems]
        params = SamplingParams(
            max_new_tokens=NEW_TOKENS,
            temperature=TEMPERATURE,
            seed=step,
            stop_token_ids=(int(tokenizer.eos_token_id),),
        )
        outs = engine.generate([p for p in prompts for _ in range(GROUP)], params)
        samples = []
        for i, out in enumerate(outs):
            problem = problems[i // GROUP]
            text = str(tokenizer.decode(out.tokens, skip_special_tokens=True))
            reward = task.reward(problem, text)
            samples.append(
                batching.Sample(
                    prompt_ids=prompts[i // GROUP],
                    completion_ids=out.tokens,
                    behaviour_logprobs=out.logprobs,
                    reward=reward,
                    group_id=str(i // GROUP),
                    weight_version=step,
                )
            )
        rewards.append(sum(s.reward for s in samples) / len(samples))
        _grpo_step(trainer, optimizer, samples, int(tokenizer.pad_token_id or 0))
        snapshots.append(measure._bf16(trainer))
        engine.load_weights(snapshots[-1])
    return snapshots, rewards


def _grpo_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    samples: list[batching.Sample],
    pad_id: int,
) -> None:
    batch = batching.collate(batching.assign_advantages(samples), pad_id)
    model.train()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    new = batching.token_logprobs(logits, batch.input_ids, batch.loss_mask, TEMPERATURE)
    loss, _ = ppo.decoupled_ppo_loss(
        new,
        batch.old_logprobs,
        batch.advantages,
        batch.loss_mask,
        clip_low=0.2,
        clip_high=0.28,
        tis_cap=2.0,
        prox_logprobs=new.detach(),
    )
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.nn.Module.eval(model)  # transformers' `eval` is untyped


def _encode(tokenizer: Any, request: str | list[Any]) -> list[int]:
    messages = request if isinstance(request, list) else [{"role": "user", "content": request}]
    ids: list[int] = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    return ids


def _step_figures(old: State, new: State, version: int) -> dict[str, Any]:
    started = time.perf_counter()
    blob = encode.encode_delta(old, new, base_version=version, new_version=version + 1)
    encode_s = time.perf_counter() - started
    target = {name: tensor.clone() for name, tensor in old.items()}
    started = time.perf_counter()
    decode.apply_delta(target, blob, have_version=version)
    apply_s = time.perf_counter() - started
    scratch = {name: torch.empty_like(tensor) for name, tensor in new.items()}
    started = time.perf_counter()
    for name, tensor in new.items():
        scratch[name].copy_(tensor)
    copy_s = time.perf_counter() - started
    header = format.read_header(blob)
    changed = sum(t.count for t in header.tensors if t.kind is format.Kind.SPARSE)
    params = sum(t.numel() for t in new.values())
    return {
        "changed": changed,
        "changed_fraction": changed / params,
        "bytes": len(blob),
        "encode_s": encode_s,
        "apply_s": apply_s,
        "copy_s": max(copy_s, 1e-9),
        "params": params,
        "bit_identical": all(
            torch.equal(target[k].view(torch.int16), new[k].view(torch.int16)) for k in new
        ),
    }
