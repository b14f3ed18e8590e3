"""The one real pretrained model on the real file: SmolLM2-135M-Instruct from its GGUF.

Loaded the way a job loads it (dequantized once, then a directory), served by the torch
engine in bfloat16 as rollouts serve it, and patched by a weight delta as remote replicas
are. The greedy answers are recorded ids: a change in conversion, tokenizer, chat template
or engine shows up as a different answer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from polyrl.api.model_source import PromptFormat
from polyrl.api.resources import RLJobSpec
from polyrl.api.wire import Completion, GenerationResponse
from polyrl.workers.deltas.decode import apply_delta
from polyrl.workers.deltas.encode import encode_delta
from polyrl.workers.models import catalog, gguf
from polyrl.workers.models.loading import load_directory
from polyrl.workers.models.prompts import PolicyPrompts
from polyrl.workers.rollout.engines.base import SamplingParams
from polyrl.workers.rollout.engines.torch_engine import TorchEngine
from polyrl.workers.runner import tokenizers as policy_tokenizers
from polyrl.workers.workflows import Episode
from polyrl.workers.workflows import conversation as conv
from polyrl.workers.workflows.sample import Sample

SYSTEM = "You are a helpful assistant."
QUESTIONS = [
    f"What is {a} + {b}? Answer with the number only." for a, b in ((18, 46), (7, 85), (33, 59))
]
# Greedy, 8 new tokens, float32 compute over the bfloat16 weights (what rollouts serve).
RECORDED = [
    [33, 40, 1232, 216, 36, 38, 446, 216],  # "18 + 46 = "
    [2068, 5482, 451, 1732, 28, 392, 737, 288],  # "To solve this problem, we need to"
    [2068, 5482, 451, 1732, 28, 392, 737, 288],
]


@pytest.fixture(scope="module")
def engine(smollm2: Path) -> Iterator[tuple[TorchEngine, object]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    model, tokenizer = load_directory(smollm2, dtype=torch.bfloat16)
    yield TorchEngine(model), tokenizer
    torch.set_num_threads(threads)


def test_smollm2_is_the_135m_llama_with_its_chatml_template(
    smollm2: Path, engine: tuple[TorchEngine, object]
) -> None:
    config = json.loads((smollm2 / "config.json").read_text())
    shape = {k: config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")}
    assert shape == {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9}
    assert (config["num_key_value_heads"], config["vocab_size"]) == (3, 49152)
    assert config["tie_word_embeddings"]
    assert config["eos_token_id"] == 2
    _, tokenizer = engine
    text = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokenizer.eos_token == "<|im_end|>"  # type: ignore[attr-defined]


def _answers(engine: TorchEngine, tokenizer: object) -> list[list[int]]:
    prompts = [
        tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for q in QUESTIONS
    ]
    params = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(2,))
    return [list(g.tokens) for g in engine.generate(prompts, params)]


def test_smollm2_answers_greedily_as_recorded(engine: tuple[TorchEngine, object]) -> None:
    assert _answers(*engine) == RECORDED


def test_a_delta_reaches_smollm2_bit_exact_and_its_tied_head(
    engine: tuple[TorchEngine, object],
) -> None:
    """An RL-like step (1 % of elements moved by a few bf16 ulps) as a delta: the patched
    weights equal the target bit for bit, and the output head, tied to the embedding,
    follows the embedding's change."""
    serving, tokenizer = engine
    host = serving.weights()
    old = {name: tensor.clone() for name, tensor in host.items()}
    generator = torch.Generator().manual_seed(0)
    new: dict[str, torch.Tensor] = {}
    for name, tensor in old.items():
        if name == "lm_head.weight":
            continue
        moved = torch.rand(tensor.shape, generator=generator) < 0.01
        nudged = tensor.float() * (1 + 0.02 * torch.randn(tensor.shape, generator=generator))
        new[name] = torch.where(moved, nudged.to(tensor.dtype), tensor)
    new["lm_head.weight"] = new["model.embed_tokens.weight"]
    blob = encode_delta(old, new, base_version=0, new_version=1)
    assert len(blob) < 0.1 * sum(t.numel() * 2 for t in new.values())
    apply_delta(host, blob, have_version=0)
    serving.load_weights(host)
    for name, tensor in new.items():
        assert torch.equal(host[name].view(torch.int16), tensor.view(torch.int16)), name
    head = serving.model.lm_head.weight
    assert torch.equal(head, new["model.embed_tokens.weight"].to(head.dtype))
    serving.load_weights(old)  # the other tests see the recorded model
    assert _answers(serving, tokenizer) == RECORDED


async def test_a_four_turn_conversation_with_smollm2_trains_on_the_ids_it_sampled(
    smollm2: Path, engine: tuple[TorchEngine, object]
) -> None:
    """SmolLM2's template writes its default system prompt before a first message that is not
    a system message: a message rendered alone would bring it back every turn. Each turn here
    is sampled by the model, and the trained sequence holds exactly those ids."""
    serving, _ = engine
    prompts = policy_tokenizers.load(
        smollm2, prompt_format=PromptFormat.CHAT, max_prompt_tokens=None
    )
    sampled: list[list[int]] = []
    sent: list[Sample] = []

    async def generate(policy: str, prompt: object, n: int, budget: int) -> GenerationResponse:
        ids = prompts.encode(prompt, max_new_tokens=budget)  # type: ignore[arg-type]
        params = SamplingParams(
            max_new_tokens=budget, temperature=1.0, stop_token_ids=(2,), seed=len(sampled)
        )
        [out] = serving.generate([ids], params)
        sampled.append(list(out.tokens))
        text = prompts.tokenizer.backend.decode(out.tokens, skip_special_tokens=True)
        done = Completion(
            tokens=out.tokens, logprobs=out.logprobs, text=text, finish_reason=out.finish_reason
        )
        return GenerationResponse(
            id="r", pod="p", weight_version=0, prompt_tokens=ids, completions=[done]
        )

    async def emit(policy: str, group: str, sample: Sample, index: int, reward: float) -> None:
        sent.append(sample)

    async def policy_prompts(policy: str) -> PolicyPrompts:
        return prompts

    spec = RLJobSpec.model_validate(
        {"policies": [{"name": "a", "model": {"path": "tiny-llama://a"}}]}
    )
    episode = Episode(
        id="e",
        spec=spec,
        task=None,
        rng=random.Random(0),
        _generate=generate,
        _emit=emit,
        _prompts=policy_prompts,
    )
    talk = await episode.converse("a", [{"role": "user", "content": QUESTIONS[0]}])
    for turn in range(4):
        [talk] = await episode.reply(talk, max_new_tokens=12)
        if turn < 3:
            talk = await episode.tell(
                talk, {"role": "user", "content": "Are you sure? Say it again."}
            )
    await episode.emit_conversation("talk", talk, 0, 1.0)
    [sample] = sent
    assert sample.loss_mask is not None
    trained = [t for t, on in zip(sample.tokens, sample.loss_mask, strict=True) if on]
    assert len(sampled) == 4
    assert trained == [t for turn in sampled for t in turn]
    text = prompts.tokenizer.backend.decode(list(talk.ids), skip_special_tokens=False)
    assert text.count("You are a helpful AI assistant named SmolLM") == 1  # once, at the start
    assert text.count("<|im_start|>user\nAre you sure? Say it again.<|im_end|>\n") == 3
    again = conv.retokenized(prompts.tokenizer, talk)
    print(
        "re-tokenised history differs at",
        conv.first_difference(talk.ids, again),
        "of",
        len(talk.ids),
    )


def test_a_fetched_model_is_found_in_the_cache_without_downloading(
    smollm2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_download(*args: object, **kwargs: object) -> Path:
        raise AssertionError("downloaded although the file is cached")

    monkeypatch.setattr(catalog, "_download", no_download)
    path = catalog.fetch("smollm2-135m-instruct")
    assert path == catalog.target(catalog.lookup("smollm2-135m-instruct"))
    assert gguf.sha256_of(path) == catalog.lookup("smollm2-135m-instruct").sha256
