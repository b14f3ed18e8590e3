"""GGUF files as a model source: dequantized once into an ordinary Hugging Face directory.

llama.cpp's GGUF is how many pretrained models are shipped (one file: weights, possibly
quantized, the tokenizer and the chat template). polyrl trains and serves float weights, so a
`model.path` that names a `.gguf` file is dequantized by transformers' own GGUF loader into a
directory (config, safetensors, tokenizer, chat template) in a cache keyed by the file's
SHA-256; from then on it loads like any other directory, in the trainer and, through the
model bundle, in rollout workers. Converting once matters: transformers' loader takes tens of
seconds for a 135M model (the tokenizer conversion alone about 15 s), a cached directory
about one.

What the conversion corrects: transformers (5.17) builds the tokenizer's special tokens from
the wrong GGUF keys for `gpt2`-style vocabularies (SmolLM2's EOS became `<|im_start|>`), so
BOS, EOS and padding are set again from the file's `tokenizer.ggml.*_token_id` fields, and the
model's config and generation config are given the same ids: a rollout that did not stop at
`<|im_end|>` would generate to its token limit every time.

Checked before any work (`check_file`, `architecture`): the file exists, starts with the GGUF
magic, matches a declared `sha256`, and holds an architecture transformers can dequantize.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from polyrl.api.launch import MODEL_CACHE_ENV

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MAGIC = b"GGUF"
SUFFIX = ".gguf"
# Where dequantized directories go when the caller's cache should not be used (a job's
# scratch directory is per run; a user's cache is shared by every run on the machine).
CACHE_ENV = MODEL_CACHE_ENV
SOURCE_FILE = "polyrl-gguf.json"
_CHUNK = 1 << 22


def is_gguf(path: str) -> bool:
    """Whether a model path names a GGUF file (by its suffix, as llama.cpp's tools do)."""
    return path.lower().endswith(SUFFIX)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_file(path: Path, *, sha256: str | None = None, name: str | None = None) -> str:
    """The file's SHA-256, once it is known to be a GGUF file (and the declared one)."""
    where = f"model {name or str(path)!r}"
    if not path.exists():
        raise ValueError(f"{where}: file {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"{where}: {str(path)!r} is not a file (a .gguf path names one file)")
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
    if head != MAGIC:
        raise ValueError(
            f"{where}: {str(path)!r} is not a GGUF file (it starts with {head!r}, not {MAGIC!r})"
        )
    digest = sha256_of(path)
    if sha256 is not None and digest != sha256.lower():
        raise ValueError(
            f"{where}: SHA-256 mismatch: the file's is {digest}, the job declares {sha256}; "
            "the file is not the one the job was written for (or it is damaged)"
        )
    return digest


def architecture(path: Path) -> str:
    """The file's `general.architecture`, once transformers is known to dequantize it."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        field = GGUFReader(path).fields.get("general.architecture")
    except (ValueError, OSError) as err:
        raise ValueError(f"model {str(path)!r}: cannot read GGUF metadata: {err}") from None
    if field is None:
        raise ValueError(f"model {str(path)!r}: its GGUF metadata names no architecture")
    arch = str(field.contents())
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"model {str(path)!r}: GGUF architecture {arch!r} cannot be dequantized by this "
            f"transformers (it reads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); "
            "convert the model to a Hugging Face directory another way"
        )
    return arch


def check(path: Path, *, sha256: str | None = None, name: str | None = None) -> str:
    """Everything that can fail before the conversion; the file's SHA-256."""
    digest = check_file(path, sha256=sha256, name=name)
    architecture(path)
    return digest


def cache_root(cache_dir: Path) -> Path:
    return Path(os.environ.get(CACHE_ENV) or cache_dir) / "gguf"


def cached(path: Path, cache_dir: Path, digest: str) -> Path | None:
    """The dequantized directory of a file already converted, else None."""
    target = cache_root(cache_dir) / digest[:16]
    return target if (target / SOURCE_FILE).exists() else None


def ensure_directory(path: Path, cache_dir: Path, *, sha256: str | None = None) -> Path:
    """The dequantized HF directory of GGUF file `path`, converting it on first use.

    Processes sharing the cache (trainer ranks, tests) take turns under a file lock: the
    first converts into a staging directory beside the target and renames it into place."""
    digest = check_file(path, sha256=sha256)
    if (found := cached(path, cache_dir, digest)) is not None:
        return found  # converted before: no need for `gguf` (not in every environment)
    architecture(path)
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / digest[:16]
    with open(root / f".{digest[:16]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (found := cached(path, cache_dir, digest)) is not None:
            return found
        staging = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}.", dir=root))
        try:
            dequantize(path, staging)
            (staging / SOURCE_FILE).write_text(
                json.dumps({"file": path.name, "sha256": digest}, indent=2) + "\n"
            )
            _readable(staging)
            shutil.rmtree(target, ignore_errors=True)  # a torn copy from an older version
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _readable(directory: Path) -> None:
    """A shared cache is read by other users' processes too (mkdtemp made it private)."""
    directory.chmod(0o755)
    for file in directory.iterdir():
        file.chmod(0o644)


def dequantize(path: Path, out_dir: Path) -> None:
    """Write GGUF file `path` as a float32 HF directory into `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from polyrl.workers.models.loading import export

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(
        path.parent, gguf_file=path.name, local_files_only=True
    )
    # The weights are plain tensors now; the flag only stops save_pretrained.
    vars(model).update(hf_quantizer=None, is_quantized=False)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _set_special_tokens(path, model, tokenizer)
    export(model, tokenizer, out_dir)


def has_chat_template(path: Path) -> bool:
    from gguf import GGUFReader

    return GGUFReader(path).fields.get("tokenizer.chat_template") is not None


def special_token_ids(path: Path) -> dict[str, int]:
    """`{"bos": id, "eos": id, "pad": id}` as the GGUF file declares them (those it has)."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    found: dict[str, int] = {}
    for key, gguf_key in (
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("pad", "padding_token_id"),
    ):
        field = fields.get(f"tokenizer.ggml.{gguf_key}")
        if field is not None:
            found[key] = int(field.contents())
    return found


def _set_special_tokens(
    path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    ids = special_token_ids(path)
    for key, token_id in ids.items():
        token = tokenizer.convert_ids_to_tokens(token_id)
        setattr(tokenizer, f"{key}_token", token)
        setattr(model.config, f"{key}_token_id", token_id)
        if model.generation_config is not None:
            setattr(model.generation_config, f"{key}_token_id", token_id)
