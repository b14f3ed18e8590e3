"""Real architectures with BPE tokenizers: built locally, loaded by the real loading code,
generating, and agreeing with the trainer on log-probs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest
import torch
from transformers import AutoTokenizer

from polyrl.api.resources import ModelSource
from polyrl.workers.models import loading as models
from polyrl.workers.models import tinybpe
from polyrl.workers.rollout.engines import torch_engine
from polyrl.workers.rollout.engines.base import SamplingParams
from polyrl.workers.trainer import batching

TinyBpe = Callable[[str], Path]


@pytest.mark.parametrize("arch", tinybpe.ARCHITECTURES)
def test_each_architecture_loads_from_its_directory_and_generates(
    arch: str, tiny_bpe: TinyBpe
) -> None:
    model, tokenizer = models.make_model(ModelSource(path=str(tiny_bpe(arch))), cache_dir=Path())
    assert model.config.model_type == arch
    assert model.config.head_dim if arch != "qwen2" else True
    assert model.config.hidden_size // model.config.num_attention_heads == tinybpe.HEAD_DIM
    assert next(model.parameters()).dtype == torch.bfloat16  # the manifest's default dtype
    assert tokenizer.eos_token_id == model.config.eos_token_id
    assert tokenizer.pad_token_id == model.config.pad_token_id
    engine = torch_engine.TorchEngine(model)
    prompt = tokenizer("12+34=")["input_ids"]
    [out] = engine.generate([prompt], SamplingParams(max_new_tokens=6, seed=0))
    assert 1 <= len(out.tokens) <= 6
    assert len(out.logprobs) == len(out.tokens)


def test_bpe_tokenizers_split_digits_and_carry_their_chat_templates(tiny_bpe: TinyBpe) -> None:
    qwen = AutoTokenizer.from_pretrained(tiny_bpe("qwen2"))
    llama = AutoTokenizer.from_pretrained(tiny_bpe("llama"))
    assert qwen.convert_ids_to_tokens(qwen("123+4")["input_ids"]) == ["1", "2", "3", "+", "4"]
    assert len(qwen("the answer is")["input_ids"]) < len("the answer is")  # real merges
    messages = [{"role": "user", "content": "7+8="}]
    chat = qwen.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\n7+8=<|im_end|>\n<|im_start|>assistant\n"
    chat = llama.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert isinstance(chat, str)
    assert chat.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert qwen.get_vocab() != llama.get_vocab()  # two vocabularies: ids never cross


def test_a_tiny_bpe_uri_builds_once_and_is_the_same_model_everywhere(tmp_path: Path) -> None:
    first = tinybpe.ensure("tiny-bpe://qwen3/a", tmp_path)
    again = tinybpe.ensure("tiny-bpe://qwen3/a", tmp_path)
    assert first == again
    elsewhere = tinybpe.ensure("tiny-bpe://qwen3/a", tmp_path / "other")
    a = (first / "model.safetensors").read_bytes()
    assert a == (elsewhere / "model.safetensors").read_bytes()
    assert (first / "tokenizer.json").read_bytes() == (elsewhere / "tokenizer.json").read_bytes()
    with pytest.raises(ValueError, match="expected tiny-bpe://<arch>/<name>"):
        tinybpe.ensure("tiny-bpe://gpt2/a", tmp_path)


def _hf_cache(cache: Path, repo: str, source: Path, revision: str = "main") -> str:
    """A huggingface_hub cache laid out by hand: refs/<revision> -> snapshots/<commit>/."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, root / "snapshots" / commit)
    (root / "refs").mkdir()
    (root / "refs" / revision).write_text(commit)
    return commit


def test_an_hf_uri_resolves_through_the_hub_cache_offline(
    tiny_bpe: TinyBpe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polyrl.workers.models import sources

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = _hf_cache(tmp_path, "tiny/qwen2", tiny_bpe("qwen2"))
    for uri in ("hf://tiny/qwen2", f"hf://tiny/qwen2@{commit}"):
        path = sources.resolve_hf(uri, cache_dir=tmp_path)
        assert path.name == commit
        assert (path / "config.json").exists()
    with pytest.raises(ValueError, match=r"is not in .* and HF_HUB_OFFLINE is set"):
        sources.resolve_hf("hf://tiny/absent", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="is not in"):
        sources.resolve_hf("hf://tiny/qwen2@v9", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="expected hf://<org>/<name>"):
        sources.parse_hf("hf://just-a-name")


def test_make_model_loads_an_hf_uri_from_the_cache_named_by_the_environment(
    tiny_bpe: TinyBpe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hf_cache(tmp_path, "tiny/llama", tiny_bpe("llama"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    source = ModelSource(path="hf://tiny/llama", dtype="float32")
    models.check_source(source)
    model, _ = models.make_model(source, cache_dir=tmp_path / "unused")
    assert model.config.model_type == "llama"


def test_a_pvc_uri_resolves_below_the_mount_root_or_says_it_is_not_mounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polyrl.workers.models import sources

    monkeypatch.setenv("POLYRL_PVC_ROOT", str(tmp_path))
    with pytest.raises(ValueError, match="claim 'models' is not mounted"):
        sources.resolve_pvc("pvc://models/qwen/7b")
    (tmp_path / "models").mkdir()
    assert sources.resolve_pvc("pvc://models/qwen/7b") == tmp_path / "models" / "qwen" / "7b"


def test_a_directory_that_is_not_a_causal_lm_is_refused_naming_the_cause(tmp_path: Path) -> None:
    from transformers import ViTConfig

    ViTConfig(hidden_size=8, num_hidden_layers=1).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'vit' model, which is not a causal language model"):
        models.check_source(ModelSource(path=str(tmp_path)))


def test_a_tokenizer_larger_than_its_model_vocabulary_is_refused(
    tiny_bpe: TinyBpe, tmp_path: Path
) -> None:
    directory = tmp_path / "m"
    shutil.copytree(tiny_bpe("qwen2"), directory)
    config = json.loads((directory / "config.json").read_text())
    config["vocab_size"] = 100  # the tokenizer has about 400 tokens
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tokenizer has \d+ tokens but the model's vocabulary"):
        models.check_source(ModelSource(path=str(directory)))


def _trainer_logprobs(model: torch.nn.Module, prompt: list[int], out: list[int]) -> torch.Tensor:
    sample = batching.Sample(prompt, out, [0.0] * len(out), 0.0, "g", 0)
    batch = batching.collate([sample], pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    values = batching.token_logprobs(logits, batch.input_ids, batch.loss_mask, 1.0)
    return values[batch.loss_mask]


def _agreement(
    tiny_bpe: TinyBpe, engine_dtype: Literal["float32", "bfloat16"]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Behaviour log-probs of 16 sampled completions and the float32 trainer's recomputation."""
    directory = str(tiny_bpe("qwen2"))
    trainer, tokenizer = models.make_model(
        ModelSource(path=directory, dtype="float32"), cache_dir=Path()
    )
    served, _ = models.make_model(ModelSource(path=directory, dtype=engine_dtype), cache_dir=Path())
    engine = torch_engine.TorchEngine(served)
    prompts = [
        tokenizer(f"{a}+{b}=")["input_ids"] for a, b in zip(range(8), range(5, 13), strict=True)
    ]
    outs = engine.generate(prompts * 2, SamplingParams(max_new_tokens=12, seed=1))
    behaviour, trained = [], []
    for prompt, out in zip(prompts * 2, outs, strict=True):
        behaviour.append(torch.tensor(out.logprobs, dtype=torch.float64))
        trained.append(_trainer_logprobs(trainer, prompt, out.tokens).double())
    return torch.cat(behaviour), torch.cat(trained)


def test_torch_engine_log_probs_agree_with_the_trainer_in_float32(tiny_bpe: TinyBpe) -> None:
    behaviour, trained = _agreement(tiny_bpe, "float32")
    assert behaviour.numel() > 50
    assert float((behaviour - trained).abs().max()) <= 1e-4


def test_bfloat16_rollouts_leave_step_zero_importance_weights_near_one(tiny_bpe: TinyBpe) -> None:
    behaviour, trained = _agreement(tiny_bpe, "bfloat16")
    weights = (trained - behaviour).exp()
    assert float((weights - 1).abs().mean()) <= 0.05
    assert float((weights > 2.0).double().mean()) <= 0.01  # tisCap's default truncates above 2


def test_chat_prompts_with_a_tokenizer_without_a_template_are_refused_before_start(
    tmp_path: Path,
) -> None:
    model, tokenizer = models.create_tiny_llama("no-template")
    models.export(model, tokenizer, tmp_path)  # the character tokenizer has no chat template
    source = ModelSource(path=str(tmp_path), promptFormat="chat")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="promptFormat is chat but its tokenizer has no chat"):
        models.check_source(source)
    models.check_source(ModelSource(path=str(tmp_path)))  # text prompts need no template
