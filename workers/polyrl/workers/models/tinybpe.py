"""Tiny real-architecture models with byte-level BPE tokenizers, made locally from configs.

Real users bring a Hugging Face directory: a Llama, Qwen2 or Qwen3 model with a byte-level BPE
tokenizer, special tokens and a chat template. Tests and CPU-only trials need the same shape
of thing without a model hub, so `build` makes one in a few seconds: a tokenizer trained here
with `tokenizers` on text the built-in tasks speak (plus plain English, so chat messages
tokenise into real merges), and a freshly initialised model of the asked architecture, written
as an ordinary HF directory that `AutoModelForCausalLM` and `AutoTokenizer` load.

Choices the rest of the system and its tests rely on:

* **Digits are split one per token** before byte-level BPE, as Qwen2's pre-tokenizer does, so
  "123" is three tokens and arithmetic stays learnable by a small model.
* **Two families of special tokens and chat templates**: Qwen's ChatML (`<|im_start|>`,
  `<|im_end|>`, EOS `<|im_end|>`) and Llama 3's headers (`<|start_header_id|>`, `<|eot_id|>`).
  Each family's vocabulary differs from the other's (different specials, different sizes, so
  different merges), which is what a job with two tokenizers needs to be tested on.
* **head_dim 64**: vLLM's CPU attention kernels refuse smaller heads.
* Weights and merges are pure functions of (architecture, name): the model is seeded from the
  name, and BPE training on a fixed corpus is deterministic.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, TypeGuard

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

Architecture = Literal["llama", "qwen2", "qwen3"]
ARCHITECTURES: tuple[Architecture, ...] = ("llama", "qwen2", "qwen3")
SCHEME = "tiny-bpe://"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
HEAD_DIM = 64

# Qwen2's split: letters in runs, every digit alone, punctuation in runs, whitespace kept.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
# (special tokens in id order, bos, eos, pad, chat template, vocabulary size)
_QWEN = (("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", "<|endoftext|>")
_LLAMA = (
    ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
     "<|eot_id|>", "<|pad|>"),
    "<|begin_of_text|>", "<|eot_id|>", "<|pad|>",
)  # fmt: skip
VOCAB = {"llama": 640, "qwen2": 512, "qwen3": 512}


def corpus() -> Iterator[str]:
    """Fixed training text: sums and their answers, verdicts, chat-like English sentences."""
    words = [
        "the",
        "answer",
        "is",
        "what",
        "you",
        "are",
        "asked",
        "to",
        "check",
        "whether",
        "a",
        "sum",
        "is",
        "right",
        "wrong",
        "yes",
        "no",
        "please",
        "solve",
        "this",
        "problem",
        "step",
        "by",
        "step",
        "you",
        "are",
        "a",
        "helpful",
        "assistant",
        "user",
        "system",
        "reverse",
        "digits",
        "of",
        "number",
        "think",
        "first",
        "then",
        "write",
        "final",
        "verdict",
        "correct",
        "incorrect",
    ]
    for a in range(100):
        for b in range(0, 100, 7):
            yield f"{a}+{b}={a + b} {a}-{b}={a - b} {a}*{b % 10}={a * (b % 10)}"
            yield f"{a}+{b}={a + b}? y" if (a + b) % 2 else f"{a}+{b}={a + b + 1}? n"
    for i in range(400):
        yield " ".join(words[(i * k) % len(words)] for k in range(1, 12)) + "."


def train_tokenizer(family: Literal["qwen", "llama"], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `corpus()`, with its family's specials and template."""
    specials, bos, eos, pad = _QWEN if family == "qwen" else _LLAMA
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus(), trainer=trainer)
    if bos is not None:  # as Llama 3's: plain text starts with BOS; templates write their own
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A $B",
            special_tokens=[(bos, backend.token_to_id(bos))],
        )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML if family == "qwen" else LLAMA3
    return tokenizer


def model_config(arch: Architecture, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    """A two-layer model of `arch` (about 0.3M parameters besides the embeddings)."""
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 128 // HEAD_DIM,
        "num_key_value_heads": 1,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if arch == "llama":
        return LlamaConfig(head_dim=HEAD_DIM, **common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    return Qwen3Config(head_dim=HEAD_DIM, **common)


_CLASSES: dict[str, type[PreTrainedModel]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
}


def seed_for(name: str) -> int:
    """A seed from the name that is the same in every process (unlike `hash`, which is salted);
    the tiny Llama's too (`model`)."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def build(arch: Architecture, name: str, out_dir: Path, *, seed: int | None = None) -> Path:
    """Write a fresh float32 model of `arch` with its family's BPE tokenizer into `out_dir`."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"architecture {arch!r}: expected one of {', '.join(ARCHITECTURES)}")
    tokenizer = train_tokenizer("llama" if arch == "llama" else "qwen", VOCAB[arch])
    config = model_config(arch, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed if seed is not None else seed_for(f"{arch}/{name}"))
        model = _CLASSES[arch](config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _is_architecture(name: str) -> TypeGuard[Architecture]:
    return name in ARCHITECTURES


def parse(uri: str) -> tuple[Architecture, str]:
    """`tiny-bpe://qwen2/a` -> ("qwen2", "a"); ValueError naming the expected form."""
    arch, _, name = uri.removeprefix(SCHEME).partition("/")
    if not _is_architecture(arch) or not _NAME.match(name):
        raise ValueError(
            f"model {uri!r}: expected {SCHEME}<arch>/<name> with arch one of "
            f"{', '.join(ARCHITECTURES)} and a name of [A-Za-z0-9._-]"
        )
    return arch, name


def ensure(uri: str, cache_dir: Path) -> Path:
    """The cached directory of `tiny-bpe://<arch>/<name>`, built on first use.

    Processes sharing the cache take turns under a file lock; the first builds beside the
    target and renames it into place."""
    arch, name = parse(uri)
    target = cache_dir / "tiny-bpe" / arch / name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
        try:
            build(arch, name, staging)
            shutil.rmtree(target, ignore_errors=True)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target
