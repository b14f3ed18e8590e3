"""The reference engine: plain PyTorch decoding over a transformers causal LM, on CPU or GPU.

It exists so the whole system runs and is tested without vLLM (CPU CI, small policies, a GPU
without vLLM), and so there is one engine simple enough to check every other against: the
contract tests hold each engine to what this one does by construction.

The decoding loop is written out rather than delegated to `model.generate`, because the loop is
where the properties the trainer depends on live: the log-prob of each sampled token under the
distribution it was drawn from (after temperature and top-p, see `base`), stopping each sequence
at its own stop token, and seeded sampling from one `torch.Generator` on the engine's device.
Prompts of a batch are left-padded and carry an attention mask and per-row position ids, so a
prompt's continuation does not depend on what it was batched with (up to float rounding); the
KV cache is the model's own (`use_cache=True`), filled by one prefill pass and then one token
per step. Finished rows keep decoding until the whole batch is done; their extra tokens are
dropped, which costs compute only when lengths in a batch differ a lot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from transformers import PreTrainedModel

from polyrl.workers.models.adapters import Adapter
from polyrl.workers.rollout.engines import base
from polyrl.workers.rollout.engines.base import Generation, SamplingParams


class TorchEngine:
    """Batched sampling with a KV cache over `model`, which the engine owns from now on.

    `compute_dtype` is the dtype the model computes in; by default its own, except on CPU,
    where bfloat16 and float16 models compute in float32. CPUs without native bfloat16 matrix
    units emulate it: the quick start's policy generated about 5x faster in float32 on this
    project's 2-core machines (`polyrl bench engine`). Upcasting is exact, so the served
    weights stay the trainer's bfloat16 values: `weights()` are then a host copy in the model's
    own dtype (what the delta codec patches), pushed into the float32 model by `load_weights`.
    The log-probs are those of the float32 computation over those weights, which is also closer
    to the trainer's (float32) than bfloat16 arithmetic would be.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        device: str = "cpu",
        max_batch_size: int = 32,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.device = str(torch.device(device))
        self.max_batch_size = max_batch_size
        self.version = 0
        weights_dtype = model.dtype
        self.compute_dtype = compute_dtype or default_compute_dtype(self.device, weights_dtype)
        self._host: dict[str, torch.Tensor] | None = None
        if self.compute_dtype != weights_dtype:  # the weights as the trainer sends them
            self._host = base.host_copy(model.state_dict())
        # nn.Module's own `to` and `eval` (both in place): transformers' wrappers confuse mypy.
        torch.nn.Module.to(model, device=device, dtype=self.compute_dtype)
        torch.nn.Module.eval(model)
        self.model = model
        self.weights_are_live = self._host is None and torch.device(device).type == "cpu"
        # Detached views of the parameters, sharing their storage (tied ones share one).
        self._live: dict[str, torch.Tensor] = dict(self.model.state_dict())
        self._vocab_size = int(self.model.config.vocab_size)
        # Adapter serving: the base weights an adapter moves, where no host copy keeps them
        # (see `load_adapter`), and the weights that now hold a merge.
        self._base: dict[str, torch.Tensor] = {}
        self._adapted: set[str] = set()
        self._adapter: Adapter | None = None
        self._slots: dict[str, Adapter] = {}  # one adapter per policy served
        self._selected: str | None = None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        base.check_prompts(prompts, self._vocab_size)
        generator = torch.Generator(device=self.device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        results: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            chunk = prompts[start : start + self.max_batch_size]
            results.extend(self._generate_batch(chunk, params, generator))
        return results

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights served, in the trainer's dtype: the live tensors or the host copy, which
        the rollout worker patches in place and pushes with `load_weights`. On an accelerator
        the host copy is made at the first call and kept, from the base where an adapter is
        merged. With an adapter, its merged weights over the base, computed here: the host
        copy holds the base, since adapters merge from it."""
        if self.weights_are_live:
            return dict(self._live)
        if self._host is None:
            self._host = base.host_copy(self._live | self._base)
        held = self._host
        if self._adapter is None:
            return held
        merged = {n: self._adapter.merged(n, self._base_of(n)) for n in self._adapted}
        return held | {n: w.to(held[n].dtype) for n, w in merged.items()}

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        base.check_state(self._live if self._host is None else self._host, state)
        with torch.no_grad():
            _copy_into(self._live, state)
            if self._host is not None:
                _copy_into(self._host, state)
        self._base, self._adapted, self._adapter = {}, set(), None
        self._slots, self._selected = {}, None

    def load_adapter(self, adapter: Adapter, slot: str = "") -> None:
        """Put `adapter` in `slot`; merged into the weights at once if the slot is selected
        (or the first). See `select_adapter` for how it is served."""
        self._check_fits(adapter)
        self._slots[slot] = adapter
        if self._selected in (None, slot):
            self.select_adapter(slot)

    def select_adapter(self, slot: str) -> None:
        """Serve `slot`'s adapter, merged on the fly into the weights the model computes with.

        Merged rather than run beside the base: decoding costs what it costs without LoRA, and
        the served model is exactly the merged one (`adapters.merge`, rounded to bf16 as the
        trainer's merged weights are). Every merge starts from the base, never from the last
        merge, so no rounding accumulates over versions or switches. The base is the host
        copy where the engine has one (bf16 weights on CPU: no memory added), else a copy of
        the adapted weights taken at the first merge. A shared pool switches between its
        policies' slots by merging again (what a switch costs: `polyrl bench lora`); an
        unchanged selection costs nothing."""
        adapter = self._slots.get(slot)
        if adapter is None:
            raise ValueError(f"no adapter in slot {slot!r}; loaded: {sorted(self._slots)}")
        if self._selected == slot and self._adapter is adapter:
            return
        merging = self._merge_bases(adapter)
        with torch.no_grad():
            for name in self._adapted - merging.keys():  # adapted before, not now: the base
                self._live[name].copy_(self._base_of(name))
            for name, weight in merging.items():
                self._live[name].copy_(adapter.merged(name, weight))
        self._adapted, self._adapter, self._selected = set(merging), adapter, slot

    def _check_fits(self, adapter: Adapter) -> None:
        have = self._host if self._host is not None else self._live
        for name, (a, b) in adapter.pairs.items():
            if name not in have:
                raise ValueError(f"the adapter adapts {name}, which the model does not have")
            if (b.shape[0], a.shape[1]) != tuple(have[name].shape):
                raise ValueError(
                    f"{name}: the adapter makes {b.shape[0]}x{a.shape[1]}, "
                    f"the model has {list(have[name].shape)}"
                )

    def _merge_bases(self, adapter: Adapter) -> dict[str, torch.Tensor]:
        for name in adapter.pairs:
            if self._host is None and name not in self._base:
                self._base[name] = self._live[name].detach().clone()  # not merged yet
        return {name: self._base_of(name) for name in adapter.pairs}

    def _base_of(self, name: str) -> torch.Tensor:
        return self._host[name] if self._host is not None else self._base[name]

    @torch.inference_mode()
    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator
    ) -> list[Generation]:
        ids, mask = _left_pad(prompts, self.device)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        progress = _Progress.start(len(prompts), params.stop_token_ids, self.device)
        logits, cache = self._forward(ids, mask, positions, None)
        for step in range(params.max_new_tokens):
            tokens, logprobs = sample(logits, params, generator)
            if progress.record(tokens, logprobs) or step + 1 == params.max_new_tokens:
                break
            mask = torch.cat([mask, mask.new_ones((len(prompts), 1))], dim=-1)
            positions = positions[:, -1:] + 1
            logits, cache = self._forward(tokens[:, None], mask, positions, cache)
        return progress.results()

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        """Float32 logits at the last position of each row, and the grown KV cache."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float(), out.past_key_values


def default_compute_dtype(device: str, weights_dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision weights on CPU (see `TorchEngine`); else the weights' own."""
    half = weights_dtype in (torch.bfloat16, torch.float16)
    return torch.float32 if half and torch.device(device).type == "cpu" else weights_dtype


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row, and its log-prob under the distribution it was drawn from."""
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1)
    else:
        scaled = logits / params.temperature
        if params.top_p < 1:
            scaled = top_p_mask(scaled, params.top_p)
        logprobs = torch.log_softmax(scaled, dim=-1)
        tokens = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """-inf outside the smallest set of most likely tokens whose mass reaches top_p."""
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # the most likely token always stays
    drop = torch.zeros_like(mass_before, dtype=torch.bool)
    drop.scatter_(-1, order, mass_before >= top_p)
    return logits.masked_fill(drop, float("-inf"))


def _left_pad(prompts: list[list[int]], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask, prompts aligned on the right (pad id 0, masked out)."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def _copy_into(targets: dict[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> None:
    for name, tensor in state.items():
        target = targets[name]
        if target.data_ptr() != tensor.data_ptr():  # pushing a tensor onto itself: nothing to do
            target.copy_(tensor)


@dataclasses.dataclass(slots=True)
class _Progress:
    """Per-row decoding state of one batch, on the device: a step costs at most one sync."""

    stop_ids: torch.Tensor
    lengths: torch.Tensor  # 0 while running; the length, stop token included, once stopped
    tokens: list[torch.Tensor] = dataclasses.field(default_factory=list)
    logprobs: list[torch.Tensor] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, rows: int, stop_token_ids: tuple[int, ...], device: str) -> _Progress:
        stop_ids = torch.tensor(stop_token_ids, dtype=torch.long, device=device)
        return cls(stop_ids, torch.zeros(rows, dtype=torch.long, device=device))

    def record(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> bool:
        """Take one step's tokens; True once every row has sampled a stop token."""
        self.tokens.append(tokens)
        self.logprobs.append(logprobs)
        if not len(self.stop_ids):
            return False
        stopped = torch.isin(tokens, self.stop_ids) & (self.lengths == 0)
        self.lengths = torch.where(stopped, len(self.tokens), self.lengths)
        return bool((self.lengths > 0).all())

    def results(self) -> list[Generation]:
        tokens = torch.stack(self.tokens, dim=1).tolist()
        logprobs = torch.stack(self.logprobs, dim=1).tolist()
        results = []
        for row, length in enumerate(self.lengths.tolist()):
            end = length or len(self.tokens)
            reason: base.FinishReason = "stop" if length else "length"
            results.append(Generation(tokens[row][:end], logprobs[row][:end], reason))
        return results
