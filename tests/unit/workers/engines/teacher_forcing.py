"""The reference every engine's log-probs are checked against: one full forward pass."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM


@torch.inference_mode()
def teacher_forced_logprobs(
    model: LlamaForCausalLM, prompt: list[int], generated: list[int], temperature: float
) -> torch.Tensor:
    ids = torch.tensor([prompt + generated], device=model.device)
    logits = model(ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logprobs.gather(-1, torch.tensor(generated, device=model.device)[:, None])[:, 0].cpu()
