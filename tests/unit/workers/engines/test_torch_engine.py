"""What the contract suite cannot see from outside: the registry, argument checks, batch limits
as the model sees them, and weights() keeping tied parameters tied (the delta codec relies on it).
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests.unit.workers.engines.teacher_forcing import teacher_forced_logprobs
from transformers import LlamaConfig, LlamaForCausalLM

from polyrl.workers.rollout import engines
from polyrl.workers.rollout.engines import base, torch_engine, vllm_engine
from polyrl.workers.rollout.engines.base import SamplingParams


def tiny_llama(seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
        **overrides,
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    torch.nn.Module.eval(model)
    return model


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_both_engines_implement_the_protocol() -> None:
    """Checked by mypy (the annotation) and at run time (the members exist)."""
    implementations: list[type[base.Engine]] = [torch_engine.TorchEngine, vllm_engine.VllmEngine]
    for implementation in implementations:
        for method in ("generate", "weights", "load_weights"):
            assert callable(getattr(implementation, method))


def test_the_registry_knows_every_engine_the_api_offers() -> None:
    # A GPU image with only torch and transformers lacks pydantic: the gpu checks still run there.
    resources = pytest.importorskip("polyrl.api.resources")
    assert set(engines.KINDS) == {engine.value for engine in resources.Engine}


def test_the_registry_builds_a_torch_engine() -> None:
    engine = engines.make_engine("torch", tiny_llama(), max_batch_size=4)
    assert isinstance(engine, torch_engine.TorchEngine)
    assert isinstance(engine, base.Engine)
    assert (engine.device, engine.version, engine.max_batch_size) == ("cpu", 0, 4)


def test_the_registry_refuses_an_unknown_engine_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown engine 'sglang'; known engines: torch, vllm"):
        engines.make_engine("sglang", tiny_llama())


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_the_vllm_engine_without_vllm_says_it_is_unavailable_and_why() -> None:
    with pytest.raises(base.EngineUnavailable, match="needs vLLM, which is not installed"):
        engines.make_engine("vllm", tiny_llama())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 1, "temperature": -0.5}, "temperature"),
        ({"max_new_tokens": 1, "top_p": 0.0}, "top_p"),
        ({"max_new_tokens": 1, "top_p": 1.5}, "top_p"),
    ],
)
def test_sampling_params_refuse_values_no_engine_can_honour(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


@pytest.mark.parametrize(
    ("prompts", "message"), [([[1], []], "prompt 1 is empty"), ([[1, 32]], r"outside \[0, 32\)")]
)
def test_generate_refuses_empty_prompts_and_unknown_token_ids(
    prompts: list[list[int]], message: str
) -> None:
    engine = torch_engine.TorchEngine(tiny_llama())
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, SamplingParams(max_new_tokens=1))


def test_the_model_never_sees_more_rows_than_max_batch_size() -> None:
    model = tiny_llama()
    rows: list[int] = []
    model.register_forward_pre_hook(
        lambda _module, _args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    engine = torch_engine.TorchEngine(model, max_batch_size=2)
    results = engine.generate([[1], [2], [3], [4], [5]], SamplingParams(max_new_tokens=3, seed=0))
    assert len(results) == 5
    assert max(rows) == 2
    assert min(rows) == 1


def test_load_weights_refuses_a_state_that_does_not_match_the_model() -> None:
    engine = torch_engine.TorchEngine(tiny_llama())
    state = dict(tiny_llama(seed=1).state_dict())
    state.pop("lm_head.weight")
    with pytest.raises(ValueError, match=r"lack \['lm_head.weight'\]"):
        engine.load_weights(state)
    state["lm_head.weight"] = torch.zeros(31, 32)
    with pytest.raises(ValueError, match=r"lm_head.weight: got torch.float32\[31, 32\]"):
        engine.load_weights(state)


def test_tied_weights_stay_tied_in_weights_and_in_host_copies() -> None:
    engine = torch_engine.TorchEngine(tiny_llama(tie_word_embeddings=True))
    live = engine.weights()
    assert live["lm_head.weight"].data_ptr() == live["model.embed_tokens.weight"].data_ptr()
    copy = base.host_copy(live)
    assert copy["lm_head.weight"].data_ptr() == copy["model.embed_tokens.weight"].data_ptr()
    assert copy["lm_head.weight"].data_ptr() != live["lm_head.weight"].data_ptr()


def test_top_p_keeps_the_smallest_set_of_likely_tokens_reaching_the_mass() -> None:
    logits = torch.tensor([[0.1, 0.5, 0.25, 0.15]]).log()
    kept = torch_engine.top_p_mask(logits, 0.7).isfinite()
    assert kept.tolist() == [[False, True, True, False]]
    kept = torch_engine.top_p_mask(logits, 0.8).isfinite()
    assert kept.tolist() == [[False, True, True, True]]
    assert torch_engine.top_p_mask(logits, 0.01).isfinite().tolist() == [
        [False, True, False, False]
    ]


def bf16_llama(seed: int = 0) -> LlamaForCausalLM:
    model = tiny_llama(seed)
    torch.nn.Module.to(model, torch.bfloat16)
    return model


def float32_logprobs(
    model: LlamaForCausalLM, prompt: list[int], generated: list[int]
) -> torch.Tensor:
    """Teacher-forced log-probs of `generated` from `model`'s weights upcast to float32."""
    upcast = torch.nn.Module.to(copy.deepcopy(model), torch.float32)
    return teacher_forced_logprobs(upcast, prompt, generated, 1.0)


def test_a_bfloat16_model_on_cpu_computes_in_float32_and_serves_its_bfloat16_weights() -> None:
    model = bf16_llama()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    engine = torch_engine.TorchEngine(bf16_llama())
    assert engine.compute_dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in engine.model.parameters())
    # The codec patches the bfloat16 values the trainer sent, so they are what weights() holds.
    assert not engine.weights_are_live
    for name, tensor in engine.weights().items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, expected[name])
    prompt = [1, 2, 3]
    [result] = engine.generate([prompt], SamplingParams(max_new_tokens=6, temperature=1, seed=0))
    torch.testing.assert_close(
        torch.tensor(result.logprobs), float32_logprobs(model, prompt, result.tokens),
        atol=1e-4, rtol=0,
    )  # fmt: skip


def test_patched_bfloat16_weights_reach_the_float32_model_when_pushed() -> None:
    engine = torch_engine.TorchEngine(bf16_llama(seed=0))
    other = bf16_llama(seed=1)
    params = SamplingParams(max_new_tokens=6, temperature=1, seed=0)
    for name, tensor in engine.weights().items():  # the rollout worker's delta loop
        tensor.copy_(other.state_dict()[name])
    engine.load_weights(engine.weights())
    [result] = engine.generate([[4, 5]], params)
    torch.testing.assert_close(
        torch.tensor(result.logprobs), float32_logprobs(other, [4, 5], result.tokens),
        atol=1e-4, rtol=0,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"got torch.float32\[32, 32\], engine has torch.bfloat16"):
        engine.load_weights(tiny_llama(seed=2).state_dict())


def test_an_explicit_compute_dtype_keeps_a_bfloat16_model_in_bfloat16() -> None:
    engine = torch_engine.TorchEngine(bf16_llama(), compute_dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in engine.model.parameters())
    assert engine.weights_are_live
    assert torch_engine.default_compute_dtype("cpu", torch.float16) == torch.float32
    assert torch_engine.default_compute_dtype("cuda", torch.bfloat16) == torch.bfloat16
    assert torch_engine.default_compute_dtype("cpu", torch.float32) == torch.float32


@pytest.mark.gpu
def test_a_cuda_engine_serves_from_the_gpu_and_offers_a_host_copy_to_patch() -> None:
    engine = torch_engine.TorchEngine(tiny_llama(), device="cuda")
    assert not engine.weights_are_live
    assert all(p.device.type == "cuda" for p in engine.model.parameters())
    host = engine.weights()
    assert all(t.device.type == "cpu" for t in host.values())
    assert engine.weights() is host  # one copy, patched in place, then pushed
