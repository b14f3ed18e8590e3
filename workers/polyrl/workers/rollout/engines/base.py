"""The one interface a rollout worker generates through, whatever does the generating.

A rollout worker (docs/architecture.md) does three things with its model: answer batched generation
requests, report the behaviour log-probs the trainer's truncated importance sampling needs, and
take new weights between requests. Everything it needs from an engine is therefore here, and
nothing else: no tokenizer (requests and replies are token ids, so the worker, the trainer and
every engine agree on them bit for bit), no scheduling policy, no server. Engines are picked by a
policy's `rollout.engine` (`polyrl.api.resources.Engine`) through `engines.make_engine`; a new one
is a new module that satisfies `Engine`, with nothing else touched.

Two choices the rest of the system relies on:

* **Log-probs are under the distribution actually sampled from**: after temperature and top-p
  truncation (renormalised), not the raw model distribution. That is the behaviour policy the
  trainer corrects for. Greedy decoding (temperature 0) reports log-probs at temperature 1, the
  model's own distribution, since there is no sampling distribution to speak of.
* **Weights are exchanged as host tensors named as in the trainer's state dict**, because that is
  what the sparse weight-delta codec patches (`deltas.decode.apply_delta` refuses anything but
  contiguous CPU tensors, and checks names and shapes against the trainer's). Where the engine
  serves from exactly those tensors (the torch engine on CPU computing in the weights' dtype) the
  codec patches the live model and nothing more is needed; elsewhere (a GPU, vLLM's fused
  layouts, bfloat16 weights the torch engine upcasts to float32 on CPU) `weights()` is a host
  copy the engine owns, and the worker pushes it with `load_weights(engine.weights())` after
  patching.
  `weights_are_live` says which; the worker's loop is the same either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # at run time only engines that compute need torch (not `simulated_engine`)
    import torch

    from polyrl.workers.models.adapters import Adapter

FinishReason = Literal["stop", "length"]


class EngineUnavailable(RuntimeError):
    """The engine asked for cannot run here (its library is missing, or too old)."""


@dataclasses.dataclass(slots=True)
class Generation:
    """One sequence's continuation of its prompt."""

    tokens: list[int]
    """The new tokens only (the prompt is the caller's); a stop token that ended it is included."""
    logprobs: list[float]
    """Behaviour log-prob of each token in `tokens` under the distribution it was sampled from."""
    finish_reason: FinishReason
    """"stop": a stop token was sampled (it is the last token); "length": max_new_tokens reached."""


@dataclasses.dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to continue every prompt of one `generate` call."""

    max_new_tokens: int
    """Upper bound on new tokens per sequence, stop token included."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax, ties to the lowest token id)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the most likely tokens whose mass reaches top_p, renormalised."""
    stop_token_ids: tuple[int, ...] = ()
    """A sequence ends right after sampling any of these (the model's EOS is not implied)."""
    seed: int | None = None
    """Same seed, prompts and engine configuration: same tokens. None: not reproducible."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@runtime_checkable
class Engine(Protocol):
    """What a rollout worker needs from a generation engine; see the module docstring."""

    version: int
    """Weight version being served. The engine never changes it: the worker sets it after an
    update, so heartbeats and trajectories carry the version the tokens were sampled under."""

    device: str
    """Where generation runs ("cpu", "cuda", "cuda:1"); reported in heartbeats and logs."""

    weights_are_live: bool
    """True when `weights()` are the very tensors `generate` reads, so patching them in place
    updates the model; False when they are a host copy to be pushed with `load_weights`."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Continue each prompt (non-empty token ids); one `Generation` per prompt, in order.

        Batched, since batching is where an engine's throughput comes from; engines split
        batches larger than they can hold themselves, so callers need not know the limit."""
        ...

    def weights(self) -> dict[str, torch.Tensor]:
        """Contiguous CPU tensors under the trainer's state-dict names, for the delta codec to
        patch in place; tied parameters share memory, as they do in the model."""
        ...

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Replace every weight with `state`'s (same names, shapes and dtypes, else ValueError).

        Values are copied into the existing tensors (no reallocation: a GPU engine keeps its
        memory plan, and `weights()` stays valid). Used for keyframes and to push a patched
        host copy; the caller then sets `version`."""
        ...


@runtime_checkable
class GeneratesAsync(Protocol):
    """An engine whose generation is a coroutine, awaited on the worker's event loop instead of
    run on a thread: a simulated engine (`simulated_engine`) waits without computing, so
    dozens of replicas can share one process, beyond the default thread pool's few threads."""

    async def agenerate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """As `Engine.generate`."""
        ...


@runtime_checkable
class ServesAdapters(Protocol):
    """An engine that serves LoRA adapters on the base it holds (`trainer.lora.sync: adapter`).

    The base is what `load_weights` last loaded (the trainer's frozen base). Adapters live in
    named slots, one per policy the engine serves (a shared pool, `rollout.servedBy`, serves
    several); each version loaded into a slot replaces the slot's last, so the engine serves
    base + that adapter and nothing of the ones before: after any number of versions it
    serves what a fresh engine given the base and that one version would. `generate` serves
    the selected slot's adapter."""

    def load_adapter(self, adapter: Adapter, slot: str = "") -> None:
        """Put `adapter` in `slot` (ValueError if it adapts a weight the base lacks, or one of
        another shape); the first slot loaded is selected. `load_weights` afterwards serves
        a base alone and empties every slot."""
        ...

    def select_adapter(self, slot: str) -> None:
        """Serve `slot`'s adapter from the next `generate` on (ValueError if it is empty)."""
        ...


def check_prompts(prompts: list[list[int]], vocab_size: int) -> None:
    """Refuse prompts no engine can answer, with the index of the offending one."""
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")


def check_state(current: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> None:
    """`new` must name exactly the tensors of `current`, with the same shapes and dtypes."""
    if current.keys() != new.keys():
        missing, extra = sorted(current.keys() - new.keys()), sorted(new.keys() - current.keys())
        raise ValueError(f"weights lack {missing[:5]} and have extra {extra[:5]}")
    for name, tensor in new.items():
        have = current[name]
        if tensor.shape != have.shape or tensor.dtype != have.dtype:
            raise ValueError(
                f"{name}: got {tensor.dtype}{list(tensor.shape)}, "
                f"engine has {have.dtype}{list(have.shape)}"
            )


def host_copy(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies that keep aliasing: tied names share one copy, as in the model."""
    copies: dict[tuple[int, int], torch.Tensor] = {}
    result = {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tensor.nbytes)
        if key not in copies or tensor.nbytes == 0:
            copies[key] = tensor.detach().to("cpu", copy=True).contiguous()
        result[name] = copies[key]
    return result
