"""The character tokenizer and tiny Llama models: deterministic, cached, exportable, offline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from polyrl.api.resources import ModelSource
from polyrl.workers.models import chartokenizer as char_tokenizer
from polyrl.workers.models import loading as tiny
from polyrl.workers.models import tinybpe


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Tiny matrices on a shared machine: more threads only contend.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


SEED_OF_ALPHA = 2203768097821086606  # the first 8 bytes of sha256(b"alpha"), little-endian, 63 bits


def tiny_source(name: str, dtype: str = "float32") -> ModelSource:
    return ModelSource.model_validate({"path": f"tiny-llama://{name}", "dtype": dtype})


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    left, right = a.state_dict(), b.state_dict()
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def test_tokenizer_has_fixed_special_and_character_ids() -> None:
    tokenizer = char_tokenizer.build_tokenizer()
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.unk_token_id == 3
    assert tokenizer.convert_tokens_to_ids(["0", "+", "a", "\n"]) == [4, 14, 22, 52]
    assert len(tokenizer) == 4 + len(char_tokenizer.ALPHABET)


def test_tokenizer_round_trips_through_save_pretrained_and_auto_tokenizer(tmp_path: Path) -> None:
    tokenizer = char_tokenizer.build_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "3,5,7 to 22:3*(5+7)?\ny"
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=char_tokenizer.ALPHABET, max_size=40))
def test_tokenizer_encodes_one_token_per_character_and_decodes_exactly(text: str) -> None:
    tokenizer = char_tokenizer.build_tokenizer()
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == char_tokenizer.BOS_ID
    assert len(ids) == len(text) + 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_maps_characters_outside_the_alphabet_to_unk() -> None:
    tokenizer = char_tokenizer.build_tokenizer()
    assert tokenizer("A!", add_special_tokens=False)["input_ids"] == [3, 3]


def test_tiny_llama_is_deterministic_for_a_name_and_differs_between_names() -> None:
    first, _ = tiny.create_tiny_llama("alpha")
    again, _ = tiny.create_tiny_llama("alpha")
    other, _ = tiny.create_tiny_llama("beta")
    assert same_weights(first, again)
    assert not same_weights(first, other)


def test_tiny_llama_creation_leaves_the_global_random_state_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny.create_tiny_llama("alpha")
    assert torch.equal(torch.rand(3), expected)


def test_tiny_llama_has_about_half_a_million_parameters() -> None:
    model, tokenizer = tiny.create_tiny_llama("alpha")
    assert isinstance(model, LlamaForCausalLM)
    count = sum(p.numel() for p in model.parameters())
    assert 300_000 <= count <= 800_000
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings


def test_make_model_caches_the_created_model_and_loads_it_the_second_time(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created, _ = tiny.make_model(tiny_source("cached"), cache_dir=cache_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in (cache_dir / "cached").iterdir()
    }

    def refuse(name: str) -> None:
        raise AssertionError("the second call must load from the cache")

    monkeypatch.setattr(tiny, "create_tiny_llama", refuse)
    loaded, tokenizer = tiny.make_model(tiny_source("cached"), cache_dir=cache_dir)
    assert same_weights(created, loaded)
    assert tokenizer.get_vocab() == char_tokenizer.vocabulary()


def test_cached_model_equals_a_freshly_created_one(cache_dir: Path) -> None:
    loaded, _ = tiny.make_model(tiny_source("fresh"), cache_dir=cache_dir)
    created, _ = tiny.create_tiny_llama("fresh")
    assert same_weights(loaded, created)


def test_make_model_loads_in_the_requested_dtype(cache_dir: Path) -> None:
    model, _ = tiny.make_model(tiny_source("typed", "bfloat16"), cache_dir=cache_dir)
    full, _ = tiny.make_model(tiny_source("typed", "float32"), cache_dir=cache_dir)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    rounded = {k: v.to(torch.bfloat16) for k, v in full.state_dict().items()}
    assert all(torch.equal(v, rounded[k]) for k, v in model.state_dict().items())


def test_export_loads_with_auto_classes_and_gives_identical_logits(tmp_path: Path) -> None:
    model, tokenizer = tiny.create_tiny_llama("exported")
    tiny.export(model, tokenizer, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    ids = torch.tensor([loaded_tokenizer("12+35=")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_make_model_loads_a_local_directory(tmp_path: Path) -> None:
    model, tokenizer = tiny.create_tiny_llama("local")
    tiny.export(model, tokenizer, tmp_path)
    source = ModelSource.model_validate({"path": str(tmp_path), "dtype": "float32"})
    loaded, loaded_tokenizer = tiny.make_model(source, cache_dir=tmp_path / "unused")
    assert same_weights(model, loaded)
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"path": "pvc://claim/models/a"}, "is not mounted"),
        ({"path": "tiny-llama://../escape"}, "tiny-llama name"),
        ({"path": "tiny-llama://a", "tokenizer": "/tok"}, "character tokenizer"),
        ({"path": "/no/such/model"}, "not a directory"),
    ],
)
def test_make_model_rejects_sources_it_cannot_load(
    source: dict[str, str], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        tiny.make_model(ModelSource.model_validate(source), cache_dir=tmp_path)


def test_seed_for_a_name_is_a_fixed_function_of_the_name() -> None:
    # A literal: `hash()` would change with each process's salt, a pod restart included.
    assert tinybpe.seed_for("alpha") == SEED_OF_ALPHA


def test_a_model_path_that_cannot_be_a_causal_lm_is_refused_with_its_cause(
    tmp_path: Path, cache_dir: Path
) -> None:
    def refused(path: Path | str) -> str:
        with pytest.raises(ValueError, match="model path") as err:
            tiny.check_source(ModelSource(path=str(path)))
        return str(err.value)

    assert "does not exist" in refused(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    assert "is not a directory" in refused(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    assert "holds no model config" in refused(tmp_path / "empty")
    from transformers import ViTConfig  # an image model: no causal-LM head exists for it

    vit = ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1)
    vit.save_pretrained(tmp_path / "vit")
    assert "'vit' model, which is not a causal language model" in refused(tmp_path / "vit")
    causal = tiny.ensure_tiny_llama("checked", cache_dir)
    tiny.check_source(ModelSource(path=str(causal)))  # a real causal LM passes
    tiny.check_source(ModelSource(path="tiny-llama://checked"))
