"""Supervised warm-up of a fresh policy, and greedy accuracy to tell whether it worked.

GRPO learns from the differences between a group's rewards: a freshly initialised model that
never answers correctly gives every group the same reward (0), hence no gradient at all. A
short run of teacher forcing on the task's own reference answers gets the policy to where some
samples are right, and RL takes over from there. The loss covers only the answer and the EOS
after it, never the prompt: the policy should learn to answer, not to write problems, and must
learn to stop.

The warm-up trains in the model's own dtype with AdamW and gradient clipping (measured on the tiny
model: clipping at 1.0 is what lets a 3e-3 learning rate fit one-digit addition in 150 steps);
give it a float32 model (casting for serving is the caller's business), since AdamW updates on
bfloat16 weights mostly round away.

`greedy_accuracy` decodes a batch of prompts at once with left padding and an attention mask
(via `model.generate`), which is what a serving engine does too; it is an evaluation helper,
not the rollout engine.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from polyrl.workers.models import lora
from polyrl.workers.models.prompts import ids_for
from polyrl.workers.tasks import base

IGNORE = -100  # the label transformers' causal-LM loss skips
Reward = Callable[[base.Problem, str], float]


class _Generating(Protocol):
    """What causal-LM classes mix in; `PreTrainedModel` itself does not declare `generate`."""

    def generate(self, **kwargs: Any) -> Any: ...


def supervised_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: base.Task,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    grad_clip: float = 1.0,
    weight_decay: float = 0.0,
    target: float | None = None,
    dev: Sequence[base.Problem] = (),
    check_every: int = 10,
    max_new_tokens: int = 8,
) -> dict[str, float]:
    """Train on prompt + answer + EOS of sampled problems; returns losses and time.

    With a `target`, greedy accuracy on `dev` (problems of the training distribution, never
    the held-out split) is checked every `check_every` steps and the warm-up stops once it
    reaches the target: how many steps a model needs varies a lot from seed to seed (its
    accuracy climbs late and steeply), so a fixed step count gives RL a very different start
    from one run to the next. The climb is steep enough that checking every 10 steps matters:
    with 128 problems a step the tiny model went from 1 % to 50 % of the dev problems within
    50 steps, so checks every 50 overshot a 20 % target by up to 50 points; most checks are
    skipped, though, while the target looks out of reach (`_TargetCheck`).
    """
    if target is not None and not dev:
        raise ValueError("a warm-up target needs dev problems to measure it on")
    rng = random.Random(seed)
    # The trainable parameters: a LoRA policy's warm-up trains the adapters RL goes on with.
    optimizer = torch.optim.AdamW(lora.trainable(model), lr=lr, weight_decay=weight_decay)
    check = _TargetCheck(target, check_every) if target is not None else None
    was_training = model.training
    losses: list[float] = []
    started = time.perf_counter()
    try:
        for step in range(1, steps + 1):
            batch = teacher_forcing_batch(tokenizer, [task.sample(rng) for _ in range(batch_size)])
            loss, exact = _train_step(model, optimizer, batch, grad_clip)
            losses.append(loss)
            if check is None or not check.due(step, exact):
                continue
            check.accuracy = greedy_accuracy(
                model, tokenizer, dev, max_new_tokens=max_new_tokens, reward=task.reward
            )
            if check.accuracy >= check.target:
                break
    finally:
        model.train(was_training)
    return _summary(losses, check, seconds=time.perf_counter() - started)


def _summary(
    losses: list[float], check: _TargetCheck | None, *, seconds: float
) -> dict[str, float]:
    """What a warm-up reports: its steps, its first and last losses, its last greedy check."""
    tail = losses[-10:] or [float("nan")]
    return {
        "steps": float(len(losses)),
        "initial_loss": losses[0] if losses else float("nan"),
        "final_loss": sum(tail) / len(tail),
        "dev_accuracy": check.accuracy if check else float("nan"),
        "greedy_checks": float(check.greedy if check else 0),
        "seconds": seconds,
    }


def _train_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    grad_clip: float,
) -> tuple[float, float]:
    """One clipped AdamW step; the batch's loss and teacher-forced exact match before it."""
    model.train()
    batch = {k: v.to(model.device) for k, v in batch.items()}
    output = model(**batch)
    optimizer.zero_grad(set_to_none=True)
    output.loss.backward()
    torch.nn.utils.clip_grad_norm_(lora.trainable(model), grad_clip)
    optimizer.step()
    return float(output.loss.detach()), teacher_forced_exact(output.logits, batch["labels"])


@dataclasses.dataclass(slots=True)
class _TargetCheck:
    """When a warm-up with a target decodes greedily (see `supervised_warmup`).

    A greedy check costs a third of the ten steps before it (the tiny model, batch 32, one
    thread: 0.19-0.24 s for 200 dev problems against 0.73 s for 10 steps), and most checks fall
    on the long plateau before the climb. So a check is skipped while the target looks out of
    reach: while the batches trained on since the last check, scored for free by their
    teacher-forced exact match (`teacher_forced_exact`: greedy exact-match accuracy on those
    problems), and the last greedy check are both below `NEAR_TARGET` of the target. The first
    check and every `FULL_CHECK_EVERY`-th always run, for rewards that accept more than the
    reference answer: a verifier's reward judges only its verdict, not its working, and there
    the warm-up may overshoot its target by up to that many checks.
    """

    target: float
    every: int
    accuracy: float = float("nan")  # of the last greedy check
    greedy: int = 0  # greedy checks run
    checks: int = 0  # check points passed, greedy or skipped
    exact: list[float] = dataclasses.field(default_factory=list)  # batches since the last one

    def due(self, step: int, exact: float) -> bool:
        """Note a trained batch's exact match; whether step `step` decodes greedily."""
        self.exact.append(exact)
        if step % self.every:
            return False
        seen = max(sum(self.exact) / len(self.exact), self.accuracy if self.greedy else 0.0)
        self.exact, self.checks = [], self.checks + 1
        if seen < NEAR_TARGET * self.target and self.checks % FULL_CHECK_EVERY != 1:
            return False
        self.greedy += 1
        return True


# A target check decodes greedily only once the training batches or the last check reach this
# share of the target (a batch mean over the steps since the last check lags the model a
# little), and every this-many-th check whatever they scored.
NEAR_TARGET = 0.75
FULL_CHECK_EVERY = 10


@torch.no_grad()
def teacher_forced_exact(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The fraction of rows whose every scored token is the model's argmax given the reference
    prefix: exactly the rows greedy decoding would answer with the reference (up to ties)."""
    predicted = logits[:, :-1].argmax(-1)
    target = labels[:, 1:]
    hit = (predicted == target) | (target == IGNORE)
    return float(hit.all(-1).float().mean())


def teacher_forcing_batch(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[base.Problem]
) -> dict[str, torch.Tensor]:
    """Right-padded input ids, attention mask and labels that score only answer + EOS."""
    rows: list[tuple[list[int], list[int]]] = []
    for problem in problems:
        prompt = ids_for(tokenizer, problem.request)
        answer = [*tokenizer(problem.answer, add_special_tokens=False)["input_ids"]]
        answer.append(tokenizer.eos_token_id)
        rows.append((prompt + answer, [IGNORE] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = [ids + [pad] * (width - len(ids)) for ids, _ in rows]
    labels = [labels + [IGNORE] * (width - len(labels)) for _, labels in rows]
    mask = [[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows]
    return {
        "input_ids": torch.tensor(input_ids),
        "attention_mask": torch.tensor(mask),
        "labels": torch.tensor(labels),
    }


def exact_answer(problem: base.Problem, completion: str) -> float:
    """The default judge: the answer text equals the reference answer."""
    return 1.0 if base.answer_text(completion) == problem.answer else 0.0


@torch.no_grad()
def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[base.Problem],
    *,
    max_new_tokens: int,
    reward: Reward = exact_answer,
    batch_size: int = 128,
) -> float:
    """The mean reward of greedy completions; pass `task.reward` where answers can differ."""
    if not problems:
        raise ValueError("greedy_accuracy needs at least one problem")
    total = 0.0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        completions = greedy_completions(
            model, tokenizer, [p.request for p in chunk], max_new_tokens
        )
        total += sum(reward(p, text) for p, text in zip(chunk, completions, strict=True))
    return total / len(problems)


def greedy_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str | Sequence[Mapping[str, str]]],
    max_new_tokens: int,
) -> list[str]:
    """Greedy continuations of `prompts` (text, or chat messages), each cut before its first
    EOS."""
    encoded = [ids_for(tokenizer, prompt) for prompt in prompts]
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.pad_token_id
    # Left padding puts every prompt's last token in the same column, where generation starts.
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
    was_training = model.training
    model.train(False)
    try:
        output = cast(_Generating, model).generate(
            input_ids=input_ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
        )
    finally:
        model.train(was_training)
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"generate returned {type(output).__name__}, expected token ids")
    return [_decode_until_eos(tokenizer, row[width:].tolist()) for row in output]


def _decode_until_eos(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    return str(tokenizer.decode(ids, skip_special_tokens=True))
