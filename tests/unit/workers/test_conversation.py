"""Multi-turn conversations stay token-exact (`polyrl.workers.workflows.conversation`).

The tokenizers and chat templates are the tiny BPE test models' (ChatML and Llama 3), read the
way the workflow runner reads them (`runner.tokenizers.load`). The rollout pool is the edge:
its replies are written here as token ids a sampler could produce, among them ids that do not
survive decode and re-encode (" the" as " ", "t", "he"), so that what a whole-history
re-tokenisation would have trained on differs from what was sampled.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.unit.workers.scripted import POLICY, Pool, episode, load, spec

from polyrl.workers.models.prompts import PolicyPrompts, render_chat, rendered_ids
from polyrl.workers.workflows import conversation as conv

TinyBpe = Callable[[str], Path]
QWEN3_LIKE = (  # as Qwen3's: an assistant turn before the last user message loses its <think>
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def pieces(prompts: PolicyPrompts, *tokens: str) -> list[int]:
    ids = [prompts.tokenizer.backend.token_to_id(t) for t in tokens]
    assert None not in ids, tokens
    return ids


def odd_reply(prompts: PolicyPrompts) -> list[int]:
    """ " the" as " ", "t", "he": ids a sampler can produce that re-encode as other ids."""
    ids = pieces(prompts, "Ġ", "t", "he")
    text = prompts.tokenizer.backend.decode(ids)
    assert prompts.tokenizer(text, add_special_tokens=False)["input_ids"] != ids
    return ids


def canonical(prompts: PolicyPrompts, text: str) -> list[int]:
    return list(prompts.tokenizer(text, add_special_tokens=False)["input_ids"])


async def four_turns(prompts: PolicyPrompts, replies: list[tuple[list[int], bool]]) -> Any:
    pool = Pool(prompts, replies)
    made, sent = episode(prompts, pool)
    talk = await made.converse(POLICY, [{"role": "user", "content": "7+8="}])
    shown: list[list[int]] = []
    for turn in range(4):
        [talk] = await made.reply(talk)
        if turn < 3:
            before = len(talk.ids)
            talk = await made.tell(talk, {"role": "user", "content": f"and {turn}+1?"})
            shown.append(list(talk.ids[before:]))
    await made.emit_conversation("talk", talk, 0, 1.0)
    return talk, pool, sent, shown


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
async def test_a_four_turn_conversation_trains_on_exactly_the_ids_sampled_turn_by_turn(
    arch: str, tiny_bpe: TinyBpe
) -> None:
    prompts = load(tiny_bpe, arch)
    odd = odd_reply(prompts)
    replies = [(odd, True), (canonical(prompts, "15"), True), (odd, False), ([*odd, *odd], True)]
    talk, pool, [sample], shown = await four_turns(prompts, replies)

    # Each turn's prompt is the previous one, its reply as sampled and the new message's ids.
    for turn in range(1, 4):
        assert pool.sent[turn][: len(pool.sent[turn - 1])] == pool.sent[turn - 1]
        assert tuple(pool.sent[turn]) == talk.ids[: len(pool.sent[turn])]
    # A message's ids are what the template writes for it, from the end of the reply on: after
    # a sampled end of turn, ChatML's newline; after a cut reply (the third), the end of turn too.
    decode = prompts.tokenizer.backend.decode
    said = [decode(ids, skip_special_tokens=False) for ids in shown]
    if arch == "qwen2":
        asked = [
            f"<|im_start|>user\nand {t}+1?<|im_end|>\n<|im_start|>assistant\n" for t in range(3)
        ]
        assert said == ["\n" + asked[0], "\n" + asked[1], "<|im_end|>\n" + asked[2]]
    else:
        asked = [
            f"<|start_header_id|>user<|end_header_id|>\n\nand {t}+1?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            for t in range(3)
        ]
        assert said == [asked[0], asked[1], "<|eot_id|>" + asked[2]]
    # The trainer gets the ids as they were, the sampled ones (and only those) under the mask.
    assert sample.prompt_tokens + sample.tokens == list(talk.ids)
    assert sample.prompt_tokens == pool.sent[0]
    assert sample.loss_mask is not None
    trained = [t for t, on in zip(sample.tokens, sample.loss_mask, strict=True) if on]
    eos = pool.eos
    sampled = [*odd, eos, *canonical(prompts, "15"), eos, *odd, *odd, *odd, eos]
    assert trained == sampled
    assert [lp for lp, on in zip(sample.logprobs, sample.loss_mask, strict=True) if not on] == [
        0.0
    ] * (len(sample.tokens) - len(trained))
    assert sample.weight_version == 1  # the oldest reply's weights
    assert sample.finish_reason == "length"  # the third reply was cut (DAPO's overlong filter)
    assert talk.turns == 4


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
async def test_a_message_shows_what_the_template_adds_for_it_separator_included(
    arch: str, tiny_bpe: TinyBpe
) -> None:
    """Where every reply is the tokenizer's own encoding, the ids are the template's rendering
    of the whole conversation: the message ids carry ChatML's newline after <|im_end|> (and,
    after a cut reply, the end of turn the policy never sampled), not a second system or BOS."""
    prompts = load(tiny_bpe, arch)
    replies = [(canonical(prompts, "15"), True), (canonical(prompts, "it is 16"), False)]
    pool = Pool(prompts, replies)
    made, _ = episode(prompts, pool)
    talk = await made.converse(POLICY, [{"role": "user", "content": "7+8="}])
    for turn in range(2):
        [talk] = await made.reply(talk)
        talk = await made.tell(talk, {"role": "user", "content": f"sure {turn}?"})
        whole = render_chat(prompts.tokenizer, talk.messages, generation=True)
        assert list(talk.ids) == rendered_ids(prompts.tokenizer, whole)
    assert pool.replies == []


async def test_re_tokenising_the_history_would_train_on_ids_the_policy_never_sampled(
    tiny_bpe: TinyBpe,
) -> None:
    prompts = load(tiny_bpe, "qwen2")
    odd = odd_reply(prompts)
    talk, _, [sample], _ = await four_turns(
        prompts, [(odd, True), (odd, True), (odd, True), (odd, True)]
    )
    again = conv.retokenized(prompts.tokenizer, talk)
    at = conv.first_difference(talk.ids, again)
    assert at == len(sample.prompt_tokens)  # the first reply: " the" became one id
    assert len(again) < len(talk.ids)
    assert again[at] == canonical(prompts, " the")[0] != talk.ids[at]


async def test_a_template_that_rewrites_earlier_turns_is_reported(tiny_bpe: TinyBpe) -> None:
    prompts = load(tiny_bpe, "qwen2", QWEN3_LIKE)
    thinking = canonical(prompts, "<think>7 and 8</think>15")
    pool = Pool(prompts, [(thinking, True)])
    made, _ = episode(prompts, pool)
    talk = await made.converse(POLICY, [{"role": "user", "content": "7+8="}])
    [talk] = await made.reply(talk)
    with pytest.raises(conv.TemplateRewritesHistory, match=r"rewrites .*<think>") as err:
        await made.tell(talk, {"role": "user", "content": "sure?"})
    assert "Qwen3" in str(err.value)


async def test_past_max_turns_or_the_context_the_episode_is_dropped_with_its_reason(
    tiny_bpe: TinyBpe,
) -> None:
    prompts = load(tiny_bpe, "qwen2")
    reply = canonical(prompts, "15")
    pool = Pool(prompts, [(reply, True)] * 4)
    made, _ = episode(prompts, pool, spec(maxTurns=2))
    talk = await made.converse(POLICY, [{"role": "user", "content": "7+8="}])
    for _ in range(2):
        [talk] = await made.reply(talk)
        talk = await made.tell(talk, {"role": "user", "content": "again"})
    with pytest.raises(conv.ConversationTooLong, match="maxTurns") as turns:
        await made.reply(talk)
    assert turns.value.reason == "turns"

    start = len(prompts.encode([{"role": "user", "content": "7+8="}]))
    made, _ = episode(
        prompts, Pool(prompts, [([*reply] * 8, False)]), spec(maxContextTokens=start + 3)
    )
    talk = await made.converse(POLICY, [{"role": "user", "content": "7+8="}])
    [talk] = await made.reply(talk)
    assert len(talk.ids) == start + 3  # the budget was cut to what the context had left
    talk = await made.tell(talk, {"role": "user", "content": "again"})
    with pytest.raises(conv.ConversationTooLong, match="maxContextTokens") as context:
        await made.reply(talk)
    assert context.value.reason == "context"


async def test_a_reply_where_a_message_is_due_and_the_reverse_are_refused(
    tiny_bpe: TinyBpe,
) -> None:
    prompts = load(tiny_bpe, "qwen2")
    made, _ = episode(prompts, Pool(prompts, [(canonical(prompts, "1"), True)]))
    talk = await made.converse(POLICY, [{"role": "user", "content": "7+8="}])
    with pytest.raises(conv.ConversationOrder, match="ask the policy first"):
        await made.tell(talk, {"role": "user", "content": "and?"})
    with pytest.raises(conv.ConversationOrder, match="nothing to train on"):
        await made.emit_conversation("g", talk, 0, 1.0)
    [replied] = await made.reply(talk)
    with pytest.raises(conv.ConversationOrder, match="tell it something first"):
        await made.reply(replied)
    assert replied.last == "1"
    assert talk.turns == 0  # conversations are values


async def test_a_group_branches_from_one_prompt(tiny_bpe: TinyBpe) -> None:
    prompts = load(tiny_bpe, "qwen2")
    replies = [(canonical(prompts, str(i)), True) for i in range(4)]
    pool = Pool(prompts, replies)
    made, sent = episode(prompts, pool)
    talk = await made.converse(POLICY, [{"role": "user", "content": "7+8="}])
    group = await made.reply(talk, 4)
    assert [c.last for c in group] == ["0", "1", "2", "3"]
    for i, member in enumerate(group):
        await made.emit_conversation("g", member, i, float(i))
    assert len(pool.sent) == 1
    assert [s.prompt_tokens for s in sent] == [pool.sent[0]] * 4
    assert made.rewards == {POLICY: [0.0, 1.0, 2.0, 3.0]}
