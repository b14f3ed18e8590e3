"""LoRA: a policy trained through low-rank adapters (PEFT), and the plain model it stands for.

The trainer wraps its model in PEFT's LoRA layers (`wrap`) and trains the adapters alone.
Everything that leaves the trainer as weights (published versions, the model bundle, an
exported model) is the merged model under the base model's own parameter names
(`merged_state`), so rollout engines and `polyrl export` need to know nothing of adapters.
The merge is computed beside the base, never done in place: PEFT's `merge_adapter` and
`unmerge_adapter` add the update to the float32 base and take it away again, and the
rounding of each round trip would move the frozen base a little every step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer

__all__ = ["ADAPTER", "LoraLayer", "wrap"]
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

from polyrl.api.lora import LoraSpec
from polyrl.workers.errors import ConfigError

ADAPTER = "default"  # PEFT's name for a model's one adapter
ALL_LINEAR = "all-linear"
SEED = 0
_BASE = ".base_layer."  # where PEFT moves a wrapped layer's own weights


def wrap(model: Any, spec: LoraSpec) -> PeftModel:
    """`model` with LoRA adapters on `spec.target_modules`, only they trainable.

    PEFT's refusals (no layer matches a name, a layer type it cannot adapt) become one
    `ConfigError` naming the setting, since no restart can help them."""
    targets: str | list[str] = (
        ALL_LINEAR if spec.target_modules == [ALL_LINEAR] else list(spec.target_modules)
    )
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.scale_alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        # The adapters' random start from a fixed seed: the same job starts from the same
        # adapters on every rank and every run (rank 0's are broadcast anyway).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            wrapped = get_peft_model(model, config)
    except (ValueError, TypeError, NotImplementedError) as err:
        kind = type(model).__name__
        raise ConfigError(f"trainer.lora cannot adapt this {kind}: {err}") from None
    if not any(isinstance(m, LoraLayer) for m in wrapped.modules()):
        raise ConfigError(f"trainer.lora.targetModules {spec.target_modules} matched no layer")
    return wrapped


def is_lora(model: Any) -> bool:
    return isinstance(model, PeftModel)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer steps: the adapters' under LoRA, else all of them."""
    return [p for p in model.parameters() if p.requires_grad]


def base_model(model: Any) -> Any:
    """The transformers model under a LoRA wrapper (its config, generation config, type)."""
    return model.get_base_model() if is_lora(model) else model


def merged_state(model: Any, *, merge: bool = True) -> dict[str, torch.Tensor]:
    """The merged model's weights (base + scale * B A) under the base model's own names, in
    the base's order: what a fresh load of the merged model has. `merge=False`: the frozen
    base alone, which adapter sync sends rollout pools once."""
    base = model.get_base_model()
    with torch.no_grad():
        deltas = {
            name: cast(Any, module).get_delta_weight(ADAPTER)
            for name, module in base.named_modules()
            if merge and isinstance(module, LoraLayer) and ADAPTER in module.lora_A
        }
        out: dict[str, torch.Tensor] = {}
        for key, tensor in base.state_dict().items():
            if ".lora_" in key:
                continue
            if _BASE in key:
                layer, leaf = key.split(_BASE, 1)
                if leaf == "weight" and layer in deltas:
                    tensor = tensor + deltas[layer].to(tensor.dtype)
                key = f"{layer}.{leaf}"
            out[key] = tensor.detach()
    return out


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapters' weights, named as PEFT's files name them."""
    return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter_state(model: Any, weights: dict[str, torch.Tensor]) -> None:
    """Put saved adapter weights (`adapter_state`) back; refuse a set that fits nothing."""
    try:
        result = set_peft_model_state_dict(model, weights)
    except RuntimeError as err:  # shapes of another rank
        raise ConfigError(f"the checkpoint's adapter does not fit trainer.lora: {err}") from None
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ConfigError(
            f"the checkpoint's adapter does not fit trainer.lora: {unexpected[:3]} unexpected"
        )


@contextlib.contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """The base model, for the KL anchor: the adapters switched off, nothing copied."""
    with model.disable_adapter():
        yield
