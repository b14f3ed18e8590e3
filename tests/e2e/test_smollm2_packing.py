"""Packed micro-batches on SmolLM2-135M-Instruct, in float32: the log-probs, loss and
gradients of a long-tailed batch equal the padded path's within 1e-4 (the float64 equality on
the test models is `tests/unit/workers/test_packing.py`). Part of `make test-learning-smollm2`
(the GGUF file `make smollm2` fetches), never of `make test`; prints the differences."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from polyrl.api.resources import AlgorithmSpec, ModelSource
from polyrl.workers.models import catalog
from polyrl.workers.models import loading as models
from polyrl.workers.trainer import batching, packing
from polyrl.workers.trainer.objectives import Normaliser, policy_loss

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.learning_smollm2]


def batch(vocab: int) -> batching.Batch:
    rng = random.Random(0)
    samples = []
    for i in range(8):
        n = max(1, min(200, round(rng.lognormvariate(math.log(16), 1.0))))
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 40))]
        completion = [rng.randrange(3, vocab) for _ in range(n)]
        samples.append(
            batching.Sample(prompt, completion, [-3.0] * n, float(i % 2), f"g{i // 4}", 0)
        )
    return batching.collate(batching.assign_advantages(samples), 0)


@pytest.mark.timeout(900)
def test_smollm2_packed_equals_padded_within_1e_4_in_float32(tmp_path: Path) -> None:
    path = catalog.target(catalog.lookup("smollm2-135m-instruct"))
    source = ModelSource(path=str(path), dtype="float32")
    model, _ = models.make_model(source, cache_dir=tmp_path)
    torch.nn.Module.eval(model)
    b = batch(int(model.config.vocab_size))
    loss = AlgorithmSpec().resolved_loss()

    def run(score: object) -> tuple[torch.Tensor, float, dict[str, torch.Tensor]]:
        model.zero_grad()
        new = score(model, b.input_ids, b.attention_mask, b.loss_mask, 1.0)  # type: ignore[operator]
        value, _ = policy_loss(
            new, b.old_logprobs, b.advantages, b.loss_mask, loss=loss,
            prox=new.detach(), normaliser=Normaliser(tokens=float(b.num_tokens)),
        )  # fmt: skip
        value.backward()  # type: ignore[no-untyped-call]
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return new.detach(), value.item(), grads

    padded, packed = run(batching.completion_logprobs), run(packing.packed_logprobs)
    logprobs = (padded[0] - packed[0]).abs().max().item()
    grads = max((padded[2][n] - g).abs().max().item() for n, g in packed[2].items())
    scale = max(g.abs().max().item() for g in padded[2].values())
    print(
        f"SmolLM2 packed vs padded, float32: log-probs max |diff| {logprobs:.2e}, loss "
        f"{padded[1]:.6f} vs {packed[1]:.6f}, gradients max |diff| {grads:.2e} "
        f"(largest gradient {scale:.2e}); {int(b.attention_mask.sum())} tokens in "
        f"{tuple(b.input_ids.shape)} padded"
    )
    assert logprobs < 1e-4
    assert abs(padded[1] - packed[1]) < 1e-4
    assert grads < 1e-4 * max(1.0, scale)
