"""Turning trajectories into padded tensors, and scoring them with the trainer's model.

Alignment convention, used by every tensor here and by `polyrl.workers.trainer.grpo.grpo_loss`:
all per-token tensors have the shape of `input_ids` ``[B, L]`` and position ``t`` holds the
value *for the token* ``input_ids[:, t]`` (its log-probability given ``input_ids[:, :t]``,
its advantage, whether it is trained on). The model's logits at ``t - 1`` predict token
``t``; `token_logprobs` does that shift once so nothing downstream has to. Position 0 can
never be scored, which is why a prompt must have at least one token.

Rows are right-padded so that real tokens keep positions ``0 .. n-1``: a causal LM given only
an attention mask then uses the same position ids as the rollout engine did, and the
log-probs agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from polyrl.workers.trainer.grpo import group_advantages

__all__ = [
    "Batch",
    "Sample",
    "assign_advantages",
    "collate",
    "completion_logprobs",
    "informative",
    "token_logprobs",
    "trained_tokens",
]


@dataclass(frozen=True, slots=True)
class Sample:
    """One completion of one prompt, as the trainer receives it from a workflow runner.

    `behaviour_logprobs[i]` is the log-probability the rollout engine gave `completion_ids[i]`
    when sampling it, under the *tempered* distribution (logits / temperature), because that
    is what `token_logprobs` recomputes. `advantage` is filled in by `assign_advantages`.
    """

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]
    reward: float
    group_id: str
    weight_version: int
    advantage: float = 0.0
    completion_mask: Sequence[bool] | None = None
    """Which completion tokens are trained on (a multi-turn episode's tool output is not);
    None: all of them."""
    finish_reason: str | None = None
    """How generation ended: "length" where a reply was cut at maxNewTokens, "stop" where
    none was; None where the runner did not say (an older wire version)."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Padded tensors for one GRPO step; every ``[B, L]`` tensor follows the module's alignment.

    `old_logprobs` and `advantages` are zero wherever `loss_mask` is False, so they are safe
    to feed to `grpo_loss` together with `loss_mask`.
    """

    input_ids: Tensor  # [B, L] long, prompt + completion, right-padded with pad_id
    attention_mask: Tensor  # [B, L] long, 1 for real tokens
    loss_mask: Tensor  # [B, L] bool, True only on completion tokens
    old_logprobs: Tensor  # [B, L] float32, behaviour log-probs at completion positions
    advantages: Tensor  # [B, L] float32, each sample's advantage on its completion tokens
    rewards: Tensor  # [B] float32
    weight_versions: Tensor  # [B] long

    @property
    def num_tokens(self) -> int:
        """Number of trained (completion) tokens; the loss normaliser for this batch alone."""
        return int(self.loss_mask.sum().item())


def assign_advantages(
    samples: Sequence[Sample], *, eps: float = 1e-6, normalize_std: bool = True
) -> list[Sample]:
    """Return copies of `samples` with GRPO group-normalised advantages from their rewards.

    Groups are formed by `group_id` over exactly the samples given, so call this on whole
    groups (after `filter_stale`: a group thinned by staleness is normalised over what is left).
    """
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    adv = group_advantages(
        rewards, [s.group_id for s in samples], eps=eps, normalize_std=normalize_std
    )
    return [dataclasses.replace(s, advantage=float(a)) for s, a in zip(samples, adv, strict=True)]


def trained_tokens(sample: Sample) -> int:
    """How many of the sample's completion tokens are trained on (its mask's, or all)."""
    mask = sample.completion_mask
    return len(sample.completion_ids) if mask is None else sum(bool(m) for m in mask)


def informative(samples: Sequence[Sample]) -> list[Sample]:
    """The samples of groups whose rewards differ, in order.

    A group whose samples were all rewarded alike (all right, or all wrong) has zero advantages
    everywhere: training on it costs a forward and backward pass per sample and moves nothing
    but the KL term. Late in training most groups of an easy task are such groups.
    """
    rewards: dict[str, set[float]] = {}
    for sample in samples:
        rewards.setdefault(sample.group_id, set()).add(sample.reward)
    return [s for s in samples if len(rewards[s.group_id]) > 1]


def _check_sample(index: int, sample: Sample) -> None:
    if len(sample.prompt_ids) == 0:
        raise ValueError(f"sample {index}: empty prompt (the first completion token needs one)")
    if len(sample.behaviour_logprobs) != len(sample.completion_ids):
        raise ValueError(
            f"sample {index}: {len(sample.behaviour_logprobs)} behaviour log-probs for "
            f"{len(sample.completion_ids)} completion tokens"
        )
    mask = sample.completion_mask
    if mask is not None and len(mask) != len(sample.completion_ids):
        raise ValueError(
            f"sample {index}: a mask of {len(mask)} for {len(sample.completion_ids)} tokens"
        )


def collate(samples: Sequence[Sample], pad_id: int) -> Batch:
    """Right-pad prompt+completion rows and lay per-token values on the completion positions.

    Raises ValueError for an empty batch, an empty prompt, or log-probs that do not match the
    completion length (a malformed trajectory must not be silently misaligned).
    """
    if not samples:
        raise ValueError("cannot collate an empty batch")
    for index, sample in enumerate(samples):
        _check_sample(index, sample)
    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    shape = (len(samples), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    old_logprobs = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    for row, s in enumerate(samples):
        p, n = len(s.prompt_ids), len(s.prompt_ids) + len(s.completion_ids)
        input_ids[row, :n] = torch.tensor([*s.prompt_ids, *s.completion_ids], dtype=torch.long)
        attention_mask[row, :n] = 1
        mask = s.completion_mask
        loss_mask[row, p:n] = True if mask is None else torch.tensor(list(mask), dtype=torch.bool)
        old_logprobs[row, p:n] = torch.tensor(list(s.behaviour_logprobs), dtype=torch.float32)
        advantages[row, p:n] = s.advantage
        if mask is not None:  # zero where not trained on, as the Batch promises
            old_logprobs[row] *= loss_mask[row]
            advantages[row] *= loss_mask[row]
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        advantages=advantages,
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        weight_versions=torch.tensor([s.weight_version for s in samples], dtype=torch.long),
    )


def token_logprobs(
    model_logits: Tensor, input_ids: Tensor, loss_mask: Tensor, temperature: float
) -> Tensor:
    """Log-probability of each token given its prefix, ``[B, L]``, zero where not in `loss_mask`.

    ``out[b, t] = log_softmax(model_logits[b, t-1] / temperature)[input_ids[b, t]]``. The
    temperature divides the logits exactly as the sampler does before drawing, so the result
    is comparable with the behaviour log-probs (an engine that reports raw, untempered
    log-probs would show a spurious importance ratio whenever temperature != 1).

    Only the masked positions are scored (a prompt can be much longer than its completion),
    and the arithmetic is done in at least float32 so bf16 logits do not lose the small
    differences the importance ratios are made of. Gradients flow to `model_logits`.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if bool(loss_mask[:, 0].any()):
        raise ValueError("loss_mask covers position 0, which has no preceding logits")
    dtype = torch.promote_types(model_logits.dtype, torch.float32)
    scored = loss_mask[:, 1:].bool()  # positions 1..L-1, predicted by logits 0..L-2
    logits = model_logits[:, :-1][scored].to(dtype) / temperature  # [N, V]
    targets = input_ids[:, 1:][scored]  # [N]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    values = picked - torch.logsumexp(logits, dim=-1)
    tail = torch.zeros(scored.shape, dtype=dtype, device=model_logits.device)
    tail = tail.masked_scatter(scored, values)
    head = torch.zeros((scored.shape[0], 1), dtype=dtype, device=model_logits.device)
    return torch.cat([head, tail], dim=1)


def completion_logprobs(
    model: Any, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, temperature: float
) -> Tensor:
    """`token_logprobs` of `model` over a batch, computing logits only where they are used.

    The output head is a large share of a small model's compute (SmolLM2-135M's tied
    49,152 x 576 head is a fifth of its FLOPs per token), and only completion positions are
    scored: the model is asked for the logits of the last columns from the one before the
    earliest completion token (`logits_to_keep`), and the result is laid out over the whole
    batch as `token_logprobs` lays it, zero elsewhere."""
    scored = loss_mask.bool().any(dim=0).nonzero()
    if scored.numel() == 0:
        return torch.zeros(loss_mask.shape, dtype=torch.float32, device=loss_mask.device)
    start = max(int(scored[0]) - 1, 0)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        logits_to_keep=input_ids.shape[1] - start,
    ).logits
    tail = token_logprobs(logits, input_ids[:, start:], loss_mask[:, start:], temperature)
    head = torch.zeros((tail.shape[0], start), dtype=tail.dtype, device=tail.device)
    return torch.cat([head, tail], dim=1)
