"""Where a policy's initial weights come from: a tiny local Llama, or a Hugging Face directory.

Tests, the quick start and CPU-only runs need real Llama-architecture models without a model hub
(no downloads at run time): `tiny-llama://<name>` builds one from a small config and the character tokenizer.
Its initial weights are a pure function of the name (the seed is a stable hash of it), so a
trainer, a test and a restarted pod that ask for the same name start from the same model; and it
is written once under `cache_dir/<name>/` as an ordinary HF directory, so later calls load it
rather than re-create it and do not depend on the library initialising weights the same way
from one version to the next.

The cache holds float32 weights whatever dtype is asked for: the dtype is a loading choice, so
one cached model serves a float32 trainer and bfloat16 rollout workers, and every one of them
sees the same rounding of the same initial weights.

`tiny-bpe://<arch>/<name>` is a tiny Llama, Qwen2 or Qwen3 with a BPE tokenizer (`tinybpe`),
cached the same way. `hf://` and `pvc://` paths resolve to local directories (`sources`); any
other path is a local HF directory (config, tokenizer, safetensors), loaded offline.

`export` writes the reverse: an HF directory that `AutoModelForCausalLM` and `AutoTokenizer`
load, for `polyrl export` and for handing a trained policy to other tools.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from polyrl.api.model_source import PromptFormat
from polyrl.api.resources import ModelSource
from polyrl.workers.models import chartokenizer as char_tokenizer
from polyrl.workers.models import gguf, sources, tinybpe

TINY_SCHEME = "tiny-llama://"
_UNRESOLVED_SCHEMES = ("s3://", "gs://", "http://", "https://")
# A name becomes a directory under the cache: no separators, no "..", nothing to escape.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def tiny_llama_config(
    vocab_size: int,
    *,
    hidden: int = 96,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate: int = 256,
    max_positions: int = 128,
) -> LlamaConfig:
    """A Llama config of about 0.45M parameters with the defaults and the character vocabulary.

    Tied embeddings keep the vocabulary's cost to one matrix; the special-token ids are the
    character tokenizer's, so `generate` pads and stops correctly without further setup.
    """
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads if kv_heads is not None else heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=char_tokenizer.PAD_ID,
        bos_token_id=char_tokenizer.BOS_ID,
        eos_token_id=char_tokenizer.EOS_ID,
    )


def make_model(
    source: ModelSource, *, cache_dir: Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer `source` names, in `source.dtype`.

    A `tiny-llama://` model is a `LlamaForCausalLM`; any other may be any causal-LM
    architecture transformers knows, so the return type is the general one.
    """
    dtype = _DTYPES[source.dtype]
    if source.path.startswith(TINY_SCHEME):
        if source.tokenizer is not None:
            raise ValueError(
                f"model {source.path!r}: a tiny-llama model always uses the character "
                f"tokenizer; remove tokenizer {source.tokenizer!r}"
            )
        directory = ensure_tiny_llama(source.path.removeprefix(TINY_SCHEME), cache_dir)
        return load_directory(directory, dtype=dtype)
    directory, tokenizer_dir = local_dirs(source, cache_dir=cache_dir)
    return load_directory(directory, dtype=dtype, tokenizer_dir=tokenizer_dir)


def prepare(source: ModelSource, *, cache_dir: Path) -> None:
    """Build a tiny model's cached directory, or convert a GGUF file, now, where `source`
    names one.

    Trainer ranks call it before they join the process group: once torch.distributed is
    initialised, transformers' `save_pretrained` writes on rank 0 only, so a model first
    written on another rank would be a directory without weights or config."""
    if source.path.startswith(TINY_SCHEME):
        ensure_tiny_llama(source.path.removeprefix(TINY_SCHEME), cache_dir)
    elif source.path.startswith(tinybpe.SCHEME):
        tinybpe.ensure(source.path, cache_dir)


def local_dirs(source: ModelSource, *, cache_dir: Path) -> tuple[Path, Path | None]:
    """The local directories of the model and (where it is elsewhere) its tokenizer."""
    path = source.path
    if path.startswith(tinybpe.SCHEME):
        directory = tinybpe.ensure(path, cache_dir)
    elif path.startswith(_UNRESOLVED_SCHEMES):
        raise ValueError(f"model path {path!r}: scheme not supported (give a local directory)")
    else:
        directory = Path(sources.resolve(path))
        if gguf.is_gguf(path):
            directory = gguf.ensure_directory(directory, cache_dir, sha256=source.sha256)
    tokenizer = source.tokenizer
    return directory, Path(sources.resolve(tokenizer)) if tokenizer is not None else None


def check_source(source: ModelSource, *, cache_dir: Path | None = None) -> None:
    """Fail early, with the cause, for a model that cannot be trained: a path missing, not a
    directory, without a config transformers reads, of an architecture that is not a causal
    language model, with a tokenizer larger than the model's vocabulary, or without the chat
    template `promptFormat: chat` needs. Reads config and tokenizer only (no weights)."""
    if source.path.startswith(TINY_SCHEME):
        if not _NAME.match(source.path.removeprefix(TINY_SCHEME)):
            raise ValueError(f"model {source.path!r}: not a valid tiny-llama name")
        return
    if source.path.startswith(tinybpe.SCHEME):
        tinybpe.parse(source.path)
        return
    if gguf.is_gguf(source.path) and _gguf_dir(source, cache_dir=cache_dir) is None:
        return  # checked as a file; not converted yet, so there is no directory to read
    directory, tokenizer_dir = local_dirs(source, cache_dir=cache_dir or Path())
    config = _causal_lm_config(source.path, directory)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or directory, local_files_only=True)
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ValueError(
            f"model {source.path!r}: its tokenizer has {len(tokenizer)} tokens but the model's "
            f"vocabulary has {vocab} embeddings: tokenizer and model do not belong together"
        )
    if source.prompt_format == PromptFormat.CHAT and not tokenizer.chat_template:
        raise ValueError(
            f"model {source.path!r}: promptFormat is chat but its tokenizer has no chat "
            "template; use promptFormat: text, or a tokenizer with a template"
        )


def source_config(source: ModelSource, *, cache_dir: Path) -> PretrainedConfig | None:
    """The model's config where it can be read without building anything (a directory or a
    resolved URI); None for the tiny models, which are built on first use."""
    if source.path.startswith((TINY_SCHEME, tinybpe.SCHEME)):
        return None
    if gguf.is_gguf(source.path) and _gguf_dir(source, cache_dir=cache_dir) is None:
        return None
    directory, _ = local_dirs(source, cache_dir=cache_dir)
    return _causal_lm_config(source.path, directory)


def _gguf_dir(source: ModelSource, *, cache_dir: Path | None) -> Path | None:
    """Check a GGUF source as a file (exists, GGUF, its declared hash, an architecture
    transformers reads, a chat template where the prompts need one); its converted directory
    if the cache has it already."""
    file = Path(sources.resolve(source.path))
    digest = gguf.check(file, sha256=source.sha256, name=source.path)
    if source.prompt_format == PromptFormat.CHAT and not gguf.has_chat_template(file):
        raise ValueError(
            f"model {source.path!r}: promptFormat is chat but the GGUF file has no chat "
            "template (tokenizer.chat_template); use promptFormat: text"
        )
    return gguf.cached(file, cache_dir or Path(), digest)


def _causal_lm_config(path: str, directory: Path) -> PretrainedConfig:
    if not directory.exists():
        raise ValueError(f"model path {path!r} does not exist")
    if not directory.is_dir():
        raise ValueError(f"model path {path!r} is not a directory")
    try:
        config: PretrainedConfig = AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(f"model path {path!r} holds no model config: {err}") from None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(
            f"model path {path!r} holds a {config.model_type!r} model, which is not a "
            "causal language model"
        )
    return config


def create_tiny_llama(name: str) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """A freshly initialised float32 tiny Llama whose weights depend only on `name`."""
    tokenizer = char_tokenizer.build_tokenizer()
    config = tiny_llama_config(len(tokenizer))
    # Fork the RNG so that building a model leaves the caller's random state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tinybpe.seed_for(name))
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.train(False)
    return model, tokenizer


def ensure_tiny_llama(name: str, cache_dir: Path) -> Path:
    """The cached directory of `tiny-llama://<name>`, creating it on first use."""
    if not _NAME.match(name):
        raise ValueError(
            f"tiny-llama name {name!r} must be 1-100 of [A-Za-z0-9._-], starting alphanumeric"
        )
    target = cache_dir / name
    if (target / "config.json").exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Processes sharing the cache (trainer ranks, a test and its workers) take turns: the
    # first builds beside the target and renames it into place, the others then find it.
    with open(cache_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir))
        try:
            model, tokenizer = create_tiny_llama(name)
            export(model, tokenizer, staging)
            shutil.rmtree(target, ignore_errors=True)  # a torn copy from an older version
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def load_directory(
    directory: Path, *, dtype: torch.dtype, tokenizer_dir: Path | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model and tokenizer from local HF directories, without touching the network."""
    if not directory.is_dir():
        raise ValueError(f"model path {str(directory)!r} is not a directory")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or directory, local_files_only=True)
    model.train(False)
    return model, tokenizer


def export(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    *,
    weights: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write an HF directory (config.json, tokenizer files, model.safetensors) into `out_dir`:
    `model`'s own weights, or `weights` under its config (a LoRA policy's merged ones)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed or weights is not None:
        # transformers' save_pretrained silently writes nothing on ranks other than 0, but
        # every rank may need its own copy (one cache per node): write the files directly.
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(out_dir)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(out_dir)
        state = model.state_dict() if weights is None else weights
        copies = {k: v.detach().contiguous().clone() for k, v in state.items()}
        save_file(copies, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    else:
        model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
