"""GGUF files as a model source: converted once, loaded like a directory, refused when wrong."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest
import torch
from tests.gguf_files import CHAT_TEMPLATE, write_llama
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from polyrl.api.resources import ModelSource, PolicySpec
from polyrl.workers import preflight
from polyrl.workers.errors import ConfigError
from polyrl.workers.models import gguf as gguf_source
from polyrl.workers.models import loading, sources

IDS = torch.tensor([[3, 17, 60, 330, 291, 226, 22, 23, 16, 24, 25, 36, 5, 9]])
Q8 = gguf.GGMLQuantizationType.Q8_0
Source = tuple[LlamaForCausalLM, PreTrainedTokenizerBase, Path]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, tiny_bpe: Callable[[str], Path]) -> Source:
    """A tiny Llama (2 heads, 1 KV head, tied), its tokenizer and an F32 GGUF of both."""
    model, tokenizer = loading.load_directory(tiny_bpe("llama"), dtype=torch.float32)
    assert isinstance(model, LlamaForCausalLM)
    file = write_llama(model, tokenizer, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, tokenizer, file


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(IDS).logits
    return logits


def test_an_f32_gguf_file_loads_with_the_source_models_logits_and_tokenizer(
    source: Source, tmp_path: Path
) -> None:
    model, tokenizer, file = source
    loaded, loaded_tokenizer = loading.make_model(
        ModelSource(path=str(file), dtype="float32"), cache_dir=tmp_path
    )
    assert isinstance(loaded, LlamaForCausalLM)
    assert loaded.config.tie_word_embeddings
    assert (_logits(loaded) - _logits(model)).abs().max().item() <= 1e-6
    text = "What is 12 + 34? Answer with the number only."
    assert loaded_tokenizer.encode(text, add_special_tokens=False) == tokenizer.encode(
        text, add_special_tokens=False
    )
    assert loaded_tokenizer.chat_template == CHAT_TEMPLATE
    # The special tokens are the file's, not what transformers' converter guesses.
    for key in ("bos", "eos", "pad"):
        assert getattr(loaded_tokenizer, f"{key}_token") == getattr(tokenizer, f"{key}_token")
        assert getattr(loaded.config, f"{key}_token_id") == getattr(tokenizer, f"{key}_token_id")
    assert loaded.generation_config.eos_token_id == tokenizer.eos_token_id


def test_a_q8_0_file_dequantizes_within_half_a_quantization_step(
    source: Source, tmp_path: Path
) -> None:
    """Q8_0 keeps each block of 32 weights as int8 times one float16 scale (max |w| / 127):
    every weight is within half a step of its source (plus the scale's float16 rounding,
    at most 127 × 2^-11 of the step), and the logits of this model within 0.02."""
    model, tokenizer, _ = source
    file = write_llama(model, tokenizer, tmp_path / "q8.gguf", quantization=Q8)
    loaded, _ = loading.load_directory(
        gguf_source.ensure_directory(file, tmp_path / "cache"), dtype=torch.float32
    )
    original = model.state_dict()
    for name, weights in loaded.state_dict().items():
        reference = original[name]
        if "q_proj" in name or "k_proj" in name or reference.ndim != 2:
            continue  # permuted rows change the blocks; covered by the logits below
        blocks = reference.reshape(-1, 32).abs().amax(dim=1, keepdim=True)
        bound = (blocks / 127 / 2 + blocks / 1024).expand(-1, 32).reshape(reference.shape)
        assert ((weights - reference).abs() <= bound).all(), name
    difference = (_logits(loaded) - _logits(model)).abs().max().item()
    assert 0 < difference <= 0.02


def test_a_file_is_converted_once_into_a_cache_keyed_by_its_hash(
    source: Source, tmp_path: Path
) -> None:
    _, _, file = source
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    first = gguf_source.ensure_directory(file, tmp_path)
    assert first == tmp_path / "gguf" / digest[:16]
    written = (first / "model.safetensors").stat().st_mtime_ns
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(file, copy)
    assert gguf_source.ensure_directory(copy, tmp_path) == first  # same bytes, same cache
    assert (first / "model.safetensors").stat().st_mtime_ns == written
    assert loading.source_config(ModelSource(path=str(file)), cache_dir=tmp_path) is not None


def test_a_path_under_the_home_directory_may_be_written_with_a_tilde(
    tiny_bpe: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loading.load_directory(tiny_bpe("llama"), dtype=torch.float32)
    (tmp_path / "home" / "models").mkdir(parents=True)
    write_llama(model, tokenizer, tmp_path / "home" / "models" / "tiny.gguf")  # type: ignore[arg-type]
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    policy = PolicySpec.model_validate({"name": "p", "model": {"path": "~/models/tiny.gguf"}})
    preflight.model_files(policy)  # found, and a GGUF file
    assert sources.resolve("~/models/tiny.gguf") == str(tmp_path / "home/models/tiny.gguf")
    assert sources.resolve("models/~x") == "models/~x"  # only a leading ~


def test_a_file_that_is_not_gguf_is_refused_before_any_work(
    tiny_bpe: Callable[[str], Path], tmp_path: Path
) -> None:
    fake = tmp_path / "model.gguf"
    shutil.copy(tiny_bpe("llama") / "model.safetensors", fake)
    with pytest.raises(ValueError, match="is not a GGUF file"):
        loading.check_source(ModelSource(path=str(fake)), cache_dir=tmp_path)
    policy = PolicySpec.model_validate({"name": "p", "model": {"path": str(fake)}})
    with pytest.raises(ConfigError, match="is not a GGUF file"):
        preflight.model_files(policy)
    missing = PolicySpec.model_validate({"name": "p", "model": {"path": str(tmp_path / "x.gguf")}})
    with pytest.raises(ConfigError, match="does not exist"):
        preflight.model_files(missing)
    assert not (tmp_path / "gguf").exists()


def test_an_architecture_transformers_cannot_dequantize_is_refused(
    source: Source, tmp_path: Path
) -> None:
    model, tokenizer, _ = source
    file = write_llama(model, tokenizer, tmp_path / "odd.gguf", architecture="nonesuch")
    with pytest.raises(ValueError, match="'nonesuch' cannot be dequantized"):
        loading.check_source(ModelSource(path=str(file)), cache_dir=tmp_path)


def test_a_declared_sha256_that_does_not_match_fails_before_conversion(
    source: Source, tmp_path: Path
) -> None:
    _, _, file = source
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    wrong = ModelSource(path=str(file), sha256="0" * 64)
    with pytest.raises(ValueError, match=f"SHA-256 mismatch: the file's is {digest}"):
        loading.check_source(wrong, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="SHA-256 mismatch"):
        loading.make_model(wrong, cache_dir=tmp_path)
    assert not (tmp_path / "gguf").exists()
    loading.check_source(ModelSource(path=str(file), sha256=digest.upper()), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="checked for GGUF files only"):
        ModelSource(path="some/directory", sha256=digest)


def test_chat_prompts_need_a_chat_template_in_the_file(source: Source, tmp_path: Path) -> None:
    model, tokenizer, _ = source
    file = write_llama(model, tokenizer, tmp_path / "plain.gguf", chat_template=None)
    chat = ModelSource.model_validate({"path": str(file), "promptFormat": "chat"})
    with pytest.raises(ValueError, match="no chat template"):
        loading.check_source(chat, cache_dir=tmp_path)
    loading.check_source(ModelSource(path=str(file)), cache_dir=tmp_path)


def test_an_hf_uri_names_one_gguf_file_of_a_repository(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, file = source
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "models--org--repo"
    (root / "snapshots" / commit / "q").mkdir(parents=True)
    shutil.copy(file, root / "snapshots" / commit / "q" / "tiny.gguf")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    path = sources.resolve_hf("hf://org/repo/q/tiny.gguf", cache_dir=tmp_path)
    assert path.read_bytes() == file.read_bytes()
    with pytest.raises(ValueError, match=r"hf://<org>/<name>/<file>\.gguf"):
        sources.parse_hf_file("hf://org/repo/weights.bin")
