"""One LoRA measurement in its own interpreter: `python -m polyrl.bench.lora_probe SPEC OUT`.

`polyrl bench lora` runs every configuration in a fresh process, so that each peak resident
memory (`getrusage`'s high-water mark) is that configuration's alone. SPEC (JSON) says what:

- `train`: the trainer's `Learner` on `model`, full fine-tuning (`rank` null) or LoRA of
  `rank`, `steps` GRPO steps over the same synthetic batch (groups of 4 with rewards 0 and 1,
  `prompt` + `completion` tokens each, micro-batches of 16). Figures: the peak resident
  memory while loading and, from a fresh high-water mark, while stepping (model, optimizer
  state, activations), the median step time, then, around one more step, the bytes one
  weight version puts on the wire: the whole model (a bf16 keyframe), its sparse delta, and
  for LoRA the adapter (keyframe) and its delta.
- `serve`: the torch engine on `model`'s base in bf16 (as a rollout worker builds it) with
  one adapter per slot in `slots`, each slot's batch generated in turn, twice. Figures: the
  peak resident memory of loading the model and, from a fresh high-water mark, of the engine
  with its adapters and batches; the median seconds of a batch and of a switch between slots.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from polyrl.bench import rss

GROUP = 4


def train(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from polyrl.api.resources import AlgorithmSpec, PolicySpec
    from polyrl.workers.deltas.encode import encode_delta, encode_keyframe
    from polyrl.workers.trainer.learner import Learner

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    lora = None if spec["rank"] is None else {"rank": spec["rank"]}
    policy = PolicySpec.model_validate(
        {
            "name": "bench",
            "model": {"path": spec["model"]},
            "trainer": {
                "lora": lora,
                "batchSize": spec["samples"],
                "microBatchSize": min(16, spec["samples"]),
                "optimizer": {"lr": spec["lr"]},
            },
        }
    )
    with tempfile.TemporaryDirectory(prefix="polyrl-bench-lora-") as workdir:
        learner = Learner(policy, AlgorithmSpec(group_size=GROUP), workdir=Path(workdir))
        samples = _samples(spec, len(learner.tokenizer))
        load_peak = rss.peak_gb()
        rss.reset_peak()
        seconds = []
        for _ in range(spec["steps"]):
            started = time.perf_counter()
            learner.step(samples)
            seconds.append(time.perf_counter() - started)
        figures: dict[str, Any] = {
            "load_peak_rss_gb": load_peak,
            "peak_rss_gb": rss.peak_gb(),
            "step_s": round(statistics.median(seconds), 3),
            "trainable_params": sum(
                p.numel() for p in learner.model.parameters() if p.requires_grad
            ),
        }
        before, adapter_before = learner.bf16(), learner.published()
        learner.step(samples)
        after, adapter_after = learner.bf16(), learner.published()
    figures["model_bytes"] = len(encode_keyframe(after, version=1))
    figures["model_delta_bytes"] = len(encode_delta(before, after, base_version=0, new_version=1))
    if lora is not None:
        figures["adapter_bytes"] = len(encode_keyframe(adapter_after, version=1))
        figures["adapter_delta_bytes"] = len(
            encode_delta(adapter_before, adapter_after, base_version=0, new_version=1)
        )
    return figures


def _samples(spec: dict[str, Any], vocab: int) -> list[Any]:
    """Groups of GROUP completions of one prompt, rewards alternating 0 and 1 (so every
    group trains), token ids drawn from the vocabulary, behaviour log-probs near -2."""
    import random

    from polyrl.workers.trainer import batching

    rng = random.Random(0)
    samples = []
    for group in range(spec["samples"] // GROUP):
        prompt = [rng.randrange(vocab) for _ in range(spec["prompt"])]
        for i in range(GROUP):
            completion = [rng.randrange(vocab) for _ in range(spec["completion"])]
            logprobs = [-2.0] * len(completion)
            samples.append(
                batching.Sample(prompt, completion, logprobs, float(i % 2), f"g{group}", 0)
            )
    return samples


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from polyrl.workers.models.adapters import Adapter
    from polyrl.workers.rollout.engines.base import SamplingParams
    from polyrl.workers.rollout.engines.torch_engine import TorchEngine

    torch.set_num_threads(spec["threads"])
    model = _base_model(spec)
    load_peak = rss.peak_gb()
    rss.reset_peak()  # from here: the engine, its adapters and its batches
    engine = TorchEngine(model, max_batch_size=spec["batch"])
    for i, slot in enumerate(spec["slots"]):
        engine.load_adapter(Adapter(_adapter(model, spec["rank"], seed=i), 2 * spec["rank"]), slot)
    vocab = int(model.config.vocab_size)
    prompts = [
        [(i * 7 + j * 13) % vocab for j in range(spec["prompt"])] for i in range(spec["batch"])
    ]
    params = SamplingParams(max_new_tokens=spec["completion"], temperature=1.0, seed=0)
    switches, batches = [], []
    for _ in range(2):
        for slot in spec["slots"]:
            started = time.perf_counter()
            engine.select_adapter(slot)
            switched = time.perf_counter()
            engine.generate(prompts, params)
            switches.append(switched - started)
            batches.append(time.perf_counter() - switched)
    return {
        "load_peak_rss_gb": load_peak,
        "peak_rss_gb": rss.peak_gb(),
        "batch_s": round(statistics.median(batches), 3),
        # A one-slot engine never switches; a shared one does before every other batch.
        "switch_s": round(max(switches[1:]) if len(spec["slots"]) > 1 else 0.0, 3),
    }


def _base_model(spec: dict[str, Any]) -> Any:
    import torch

    from polyrl.api.resources import ModelSource
    from polyrl.workers.models import loading as models

    with tempfile.TemporaryDirectory(prefix="polyrl-bench-lora-") as cache:
        source = ModelSource(path=spec["model"], dtype="bfloat16")
        model, _ = models.make_model(source, cache_dir=Path(cache))
    return torch.nn.Module.to(model, dtype=torch.bfloat16)


def _adapter(model: Any, rank: int, *, seed: int) -> dict[str, Any]:
    """A trained-looking adapter on every linear layer of the attention and MLP blocks."""
    import torch

    from polyrl.workers.models.adapters import PREFIX

    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lm_head" not in name:
            out_features, in_features = module.weight.shape
            a = torch.randn(rank, in_features, generator=gen) / in_features**0.5
            b = torch.randn(out_features, rank, generator=gen) * 0.01
            state[f"{PREFIX}{name}.lora_A.weight"] = a.to(torch.bfloat16)
            state[f"{PREFIX}{name}.lora_B.weight"] = b.to(torch.bfloat16)
    return state


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    figures = train(spec) if spec["kind"] == "train" else serve(spec)
    Path(argv[2]).write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
