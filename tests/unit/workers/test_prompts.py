"""Prompts become ids once, with the policy's own tokenizer, and the ids are what trains."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from polyrl.api.model_source import PromptFormat
from polyrl.api.wire import Trajectory
from polyrl.workers.models import chartokenizer as char_tokenizer
from polyrl.workers.models import prompts
from polyrl.workers.trainer import learner

TinyBpe = Callable[[str], Path]


def test_text_messages_and_ids_each_become_the_ids_the_tokenizer_gives(tiny_bpe: TinyBpe) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_bpe("qwen2"))
    policy = prompts.PolicyPrompts(tokenizer, vocab_size=len(tokenizer))
    assert policy.encode("7+8=") == tokenizer("7+8=")["input_ids"]
    chat = policy.encode([{"role": "user", "content": "7+8="}])
    assert tokenizer.decode(chat) == "<|im_start|>user\n7+8=<|im_end|>\n<|im_start|>assistant\n"
    assert policy.encode([5, 6, 7]) == [5, 6, 7]
    as_chat = prompts.PolicyPrompts(tokenizer, prompt_format=PromptFormat.CHAT)
    assert as_chat.encode("7+8=") == chat  # text in a chat-format policy: one user message


def test_the_llama_template_writes_its_own_bos_once(tiny_bpe: TinyBpe) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_bpe("llama"))
    ids = prompts.PolicyPrompts(tokenizer).encode([{"role": "user", "content": "hi"}])
    assert ids.count(tokenizer.bos_token_id) == 1
    assert ids[0] == tokenizer.bos_token_id


def test_prompts_a_policy_cannot_take_are_refused_with_the_cause() -> None:
    policy = prompts.PolicyPrompts(
        char_tokenizer.build_tokenizer(), max_prompt_tokens=5, vocab_size=10
    )
    with pytest.raises(prompts.PromptError, match="need a tokenizer with a chat template"):
        policy.encode([{"role": "user", "content": "1+1="}])
    with pytest.raises(
        prompts.PromptTooLong, match="6 tokens is longer than the policy's limit of 5"
    ):
        policy.encode("12+34")  # BOS and five characters
    with pytest.raises(prompts.PromptError, match="outside this policy's vocabulary"):
        policy.encode([3, 10])
    for bad in ([], [{"content": "no role"}], 3.5, [1, "2"]):
        with pytest.raises(prompts.PromptError, match="a prompt is text"):
            policy.encode(bad)  # type: ignore[arg-type]


def test_the_limit_keeps_room_for_the_generation_budget() -> None:
    assert prompts.limit(None, None, 16) is None
    assert prompts.limit(None, 128, 16) == 112
    assert prompts.limit(50, 128, 16) == 50
    assert prompts.limit(500, 128, 16) == 112


def test_ids_that_decode_and_re_encode_differently_are_trained_as_sampled(
    tiny_bpe: TinyBpe,
) -> None:
    """With BPE, decode -> encode is not the identity: " the" sampled as " ", "t", "he"
    re-encodes as one token. The trainer takes the trajectory's ids as they are."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bpe("qwen2"))
    pieces = [int(tokenizer.convert_tokens_to_ids(t)) for t in ("Ġ", "t", "he")]  # type: ignore[arg-type]
    assert tokenizer.unk_token_id not in pieces
    text = tokenizer.decode(pieces)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] != pieces  # not a round trip
    prompt = prompts.PolicyPrompts(tokenizer).encode("7+8=")
    trajectory = Trajectory(
        id="e/g/0",
        episode_id="e",
        group_id="e/g",
        policy="solver",
        prompt_tokens=prompt,
        tokens=pieces,
        logprobs=[-1.0, -1.0, -1.0],
        reward=1.0,
        weight_version=0,
        created_at=0.0,
    )
    [sample] = learner.to_samples([trajectory])
    assert list(sample.prompt_ids) == prompt
    assert list(sample.completion_ids) == pieces


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_runners_light_tokenizer_encodes_as_transformers_does(
    arch: str, tiny_bpe: TinyBpe
) -> None:
    """The workflow runner reads tokenizers without transformers (which imports torch): the
    same ids for text and for chat messages through the template."""
    from polyrl.workers.runner import tokenizers as policy_tokenizers

    directory = tiny_bpe(arch)
    reference = AutoTokenizer.from_pretrained(directory)
    for prompt_format in (PromptFormat.TEXT, PromptFormat.CHAT):
        light = policy_tokenizers.load(
            directory, prompt_format=prompt_format, max_prompt_tokens=None
        )
        heavy = prompts.PolicyPrompts(reference, prompt_format=prompt_format)
        assert isinstance(light.tokenizer, policy_tokenizers.BundleTokenizer)
        for prompt in (
            "12+34=",
            " the answer is 7",
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "9+9="}],
        ):
            assert light.encode(prompt) == heavy.encode(prompt), (prompt_format, prompt)
    assert light.context == 256
    assert light.vocab_size == len(reference)
