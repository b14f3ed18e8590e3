"""Supervised warm-up: loss on answers only, batched greedy decoding, and that it really teaches."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
import torch

from polyrl.workers.models import loading as tiny
from polyrl.workers.tasks import arithmetic, base
from polyrl.workers.trainer import warmup


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Tiny matrices on a shared machine: a second thread only contends (measured: 20x slower).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def problems(*pairs: tuple[str, str]) -> list[base.Problem]:
    return [base.Problem(prompt=p, answer=a, id=base.problem_id("t", p)) for p, a in pairs]


def test_teacher_forcing_scores_only_the_answer_and_eos() -> None:
    _, tokenizer = tiny.create_tiny_llama("warmup")
    batch = warmup.teacher_forcing_batch(tokenizer, problems(("1+2=", "3"), ("12+35=", "47")))
    eos, pad, ignore = tokenizer.eos_token_id, tokenizer.pad_token_id, warmup.IGNORE

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    assert batch["input_ids"][0].tolist() == [1, *ids("1+2=3"), eos, pad, pad, pad]
    assert batch["labels"][0].tolist() == [ignore] * 5 + [*ids("3"), eos] + [ignore] * 3
    assert batch["labels"][1].tolist() == [ignore] * 7 + [*ids("47"), eos]
    assert batch["attention_mask"].tolist() == [[1] * 7 + [0] * 3, [1] * 10]


def test_batched_greedy_decoding_matches_one_prompt_at_a_time() -> None:
    model, tokenizer = tiny.create_tiny_llama("warmup")
    prompts = ["1+2=", "12+35=", "3,5,7 to 22:"]
    batched = warmup.greedy_completions(model, tokenizer, prompts, 6)
    alone = [warmup.greedy_completions(model, tokenizer, [p], 6)[0] for p in prompts]
    assert batched == alone


def test_greedy_accuracy_uses_the_given_reward() -> None:
    model, tokenizer = tiny.create_tiny_llama("warmup")
    batch = problems(("1+2=", "3"), ("2+2=", "4"))
    assert warmup.greedy_accuracy(model, tokenizer, batch, max_new_tokens=3) == 0.0
    always = warmup.greedy_accuracy(
        model, tokenizer, batch, max_new_tokens=3, reward=lambda p, c: 1.0, batch_size=1
    )
    assert always == 1.0


@pytest.mark.slow
def test_warmup_raises_greedy_accuracy_on_one_digit_addition() -> None:
    model, tokenizer = tiny.create_tiny_llama("warmup")
    task = arithmetic.make({"digits": 1}, held_out=10, seed=0)
    rng = random.Random(0)
    training = list({p.id: p for p in (task.sample(rng) for _ in range(2000))}.values())
    assert len(training) == 90
    before = warmup.greedy_accuracy(model, tokenizer, training, max_new_tokens=4)
    started = time.perf_counter()
    stats = warmup.supervised_warmup(
        model, tokenizer, task, steps=150, batch_size=32, lr=3e-3, seed=0
    )
    after = warmup.greedy_accuracy(model, tokenizer, training, max_new_tokens=4)
    print(
        f"warm-up: accuracy {before:.2f} -> {after:.2f}, {stats}, {time.perf_counter() - started:.1f}s"
    )
    assert stats["final_loss"] < stats["initial_loss"] / 4
    assert after >= before + 0.3
    assert not model.training
    # What the warm-up's check skipping relies on: teacher-forced exact match is greedy
    # exact-match accuracy on the same problems (ties and padding aside).
    batch = warmup.teacher_forcing_batch(tokenizer, training)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert abs(warmup.teacher_forced_exact(logits, batch["labels"]) - after) <= 0.03


class Lenient(arithmetic.Arithmetic):
    """Arithmetic whose judge accepts anything: a reached target, whatever the model says."""

    def reward(self, problem: base.Problem, completion: str) -> float:
        return 1.0


def towards(task: arithmetic.Arithmetic, *, target: float, steps: int) -> dict[str, float]:
    """A fresh tiny model's warm-up on `task` towards `target`, checked every 10 steps."""
    model, tokenizer = tiny.create_tiny_llama("warmup-target")
    dev = [task.sample(random.Random(1)) for _ in range(4)]
    return warmup.supervised_warmup(
        model, tokenizer, task, steps=steps, batch_size=4, lr=1e-3, seed=0,
        target=target, dev=dev, check_every=10,
    )  # fmt: skip


def test_a_warm_up_target_stops_at_the_first_check_that_reaches_it() -> None:
    result = towards(Lenient(digits=1, ops="+", held_out=10, seed=0), target=0.5, steps=40)
    assert result["steps"] == 10
    assert result["dev_accuracy"] == 1.0


def test_an_unreached_warm_up_target_runs_every_step() -> None:
    result = towards(
        arithmetic.Arithmetic(digits=2, ops="+", held_out=10, seed=0), target=1.0, steps=20
    )
    assert result["steps"] == 20
    assert result["dev_accuracy"] < 1.0


def test_greedy_checks_are_skipped_while_the_training_batches_are_far_from_the_target() -> None:
    result = towards(
        arithmetic.Arithmetic(digits=2, ops="+", held_out=10, seed=0), target=1.0, steps=120
    )
    # 12 check points; an untrained model's exact match stays near 0, so only the first and
    # the eleventh (every FULL_CHECK_EVERY-th) decode greedily.
    assert result["steps"] == 120
    assert result["greedy_checks"] == 2


def test_teacher_forced_exact_counts_rows_whose_every_scored_token_is_the_argmax() -> None:
    ignore = warmup.IGNORE
    # Two rows of four positions over a vocabulary of 3; position t predicts label t + 1.
    logits = torch.zeros(2, 4, 3)
    logits[0, :, 1] = 1.0  # row 0 always predicts token 1
    logits[1, :, 2] = 1.0  # row 1 always predicts token 2
    labels = torch.tensor([[ignore, ignore, 1, 1], [ignore, 2, 0, ignore]])
    assert warmup.teacher_forced_exact(logits, labels) == 0.5
    labels[1, 2] = 2
    assert warmup.teacher_forced_exact(logits, labels) == 1.0


def test_a_warm_up_target_without_dev_problems_is_refused() -> None:
    model, tokenizer = tiny.create_tiny_llama("warmup-target")
    task = arithmetic.Arithmetic(digits=1, ops="+", held_out=10, seed=0)
    with pytest.raises(ValueError, match="dev problems"):
        warmup.supervised_warmup(
            model, tokenizer, task, steps=1, batch_size=1, lr=1e-3, seed=0, target=0.5
        )


def test_weight_decay_shrinks_every_weight_by_lr_times_decay_on_top_of_the_update() -> None:
    task = arithmetic.Arithmetic(digits=1, ops="+", held_out=10, seed=0)
    trained = {}
    for decay in (0.0, 0.5):
        model, tokenizer = tiny.create_tiny_llama("warmup-decay")
        start = {k: v.clone() for k, v in model.state_dict().items()}
        warmup.supervised_warmup(
            model, tokenizer, task, steps=1, batch_size=4, lr=1e-2, seed=0, weight_decay=decay
        )
        trained[decay] = model.state_dict()
    for name, before in start.items():
        # AdamW's decoupled decay: p <- p - lr * decay * p, then the same Adam step.
        shrink = trained[0.0][name] - trained[0.5][name]
        torch.testing.assert_close(shrink, 1e-2 * 0.5 * before, rtol=1e-3, atol=1e-6)
