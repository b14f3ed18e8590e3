"""A character-level tokenizer for the built-in tasks, made locally in a few milliseconds.

The built-in tasks (arithmetic, countdown, and the verifier prompts of the solver-verifier
workflow) speak a tiny alphabet, and the tiny models of tests and quick starts must be created
without any model hub. One token per character keeps the vocabulary at a few dozen entries, so
a model of half a million parameters spends them on the task rather than on embeddings, and it
makes every string round-trip exactly through encode/decode, which exact reward checking relies on.

It is a real Hugging Face fast tokenizer (a `tokenizers` WordLevel model over single characters)
rather than a hand-rolled mapping, because the same object has to travel where a real model's
tokenizer travels: `save_pretrained` into the model directory, the job's Object Store, `polyrl
export`, and back through `AutoTokenizer.from_pretrained`, with vLLM able to read it too.

Ids are fixed by construction (special tokens first, then `ALPHABET` in order), so two builds,
on any machine and any library version, agree token for token.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

if TYPE_CHECKING:  # transformers' tokenizer classes import torch; `backend` needs neither
    from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# Their ids are part of the model config (pad/bos/eos_token_id) and must not move.
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))

ALPHABET = string.digits + "+-*/=() " + string.ascii_lowercase + "?:.,\n"


def vocabulary() -> dict[str, int]:
    """Token -> id: the special tokens, then one entry per character of `ALPHABET`."""
    tokens = [*SPECIAL_TOKENS, *ALPHABET]
    return {token: index for index, token in enumerate(tokens)}


def backend() -> Tokenizer:
    """The `tokenizers` object itself (what a bundle's tokenizer.json holds)."""
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token=UNK))
    # `[\s\S]` rather than `.`: a newline must become a token of its own, like any character.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Without a decoder, `tokenizers` joins tokens with spaces; Fuse concatenates them.
    tokenizer.decoder = decoders.Fuse()
    # BOS gives every prompt a fixed first position to attend to, however short the prompt.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tokenizer


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer; encoding adds BOS in front, never EOS (the model writes it)."""
    from transformers import PreTrainedTokenizerFast

    # transformers leaves this constructor unannotated.
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend(),
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        # Spaces are characters of the tasks; "cleaning" them up would change the text.
        clean_up_tokenization_spaces=False,
    )
