"""A LoRA adapter as rollout engines take it: PEFT-named tensors, a scale, and the merge.

With `trainer.lora.sync: adapter` the trainer publishes the adapters alone (PEFT's
`get_peft_model_state_dict`, in bf16) and the frozen base once; an engine then needs, for
each adapted layer, the base weight it moves and the pair (A, B), and the scale alpha / r.
This module knows exactly that and imports no PEFT: vLLM's environment has none, and the
names are PEFT's *file* format (`base_model.model.<module>.lora_A.weight`), the one vLLM and
every other loader read, so it does not move with PEFT's internals.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import torch

PREFIX = "base_model.model."
_A, _B = ".lora_A.weight", ".lora_B.weight"
CONFIG_FILE = "adapter_config.json"  # PEFT's file names, which vLLM loads
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One adapter version: `tensors` under PEFT's names, and the scale numerator `alpha`."""

    tensors: Mapping[str, torch.Tensor]
    alpha: int
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    """Base weight name (the transformers model's) -> (A, B) that update it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pairs", _pairs(self.tensors))

    @property
    def rank(self) -> int:
        return int(next(iter(self.pairs.values()))[0].shape[0])

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def modules(self) -> list[str]:
        """The adapted layers' own names (q_proj, ...), as PEFT's `target_modules` lists them."""
        return sorted({name.removesuffix(".weight").rsplit(".", 1)[-1] for name in self.pairs})

    def merged(self, name: str, base: torch.Tensor) -> torch.Tensor:
        """`base` (the weight named `name`) moved by this adapter; see `merge`."""
        a, b = self.pairs[name]
        return merge(base, a, b, self.scale)

    def save(self, directory: Path) -> None:
        """PEFT's two files, which vLLM's `LoRARequest` loads."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.tensors.items()}, directory / WEIGHTS_FILE)
        config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "target_modules": self.modules,
            "fan_in_fan_out": False,
            "use_rslora": False,
            "use_dora": False,
            "modules_to_save": None,
        }
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))


def merge(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """base + (B A) * scale in float32, rounded to bf16 (the wire's precision), in the base's
    dtype.

    The same arithmetic, in the same order, as PEFT's `get_delta_weight` added to the base,
    and the same rounding as the trainer's merged weights (`lora.merged_state`, published in
    bf16 under `sync: merged`): the two differ only by the adapter's own rounding to bf16.
    Computed where the adapter is (the host, as it arrives), so that an engine's weights on an
    accelerator get the same bits; the result goes where `base` is."""
    delta = (b.float() @ a.float()) * scale
    merged = (base.to(delta.device).float() + delta).to(torch.bfloat16)
    return merged.to(device=base.device, dtype=base.dtype)


def _pairs(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Group A and B by the layer they adapt; refuse what is not a complete set of pairs."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        if not name.startswith(PREFIX) or not name.endswith((_A, _B)):
            raise ValueError(f"{name} is not a LoRA adapter weight (PEFT's file names)")
        layer, half = name[len(PREFIX) : -len(_A)], name[-len(_A) :]
        halves.setdefault(f"{layer}.weight", {})[half] = tensor
    if not halves:
        raise ValueError("the adapter holds no weights")
    pairs = {}
    for weight, pair in halves.items():
        if pair.keys() != {_A, _B}:
            raise ValueError(f"{weight}: the adapter has only one of lora_A and lora_B")
        a, b = pair[_A], pair[_B]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise ValueError(f"{weight}: lora_A {list(a.shape)} and lora_B {list(b.shape)} differ")
        pairs[weight] = (a, b)
    ranks = {a.shape[0] for a, _ in pairs.values()}
    if len(ranks) != 1:
        raise ValueError(f"the adapter's layers have different ranks {sorted(ranks)}")
    return pairs
