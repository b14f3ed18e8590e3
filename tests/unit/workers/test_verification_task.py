"""The verifier's task: right and near-miss candidates, half each, worked and judged "y" or "n"."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from polyrl.api.verifier import VerifierSpec
from polyrl.workers.tasks import arithmetic
from polyrl.workers.tasks import base as task_base
from polyrl.workers.workflows.solver_verifier import verdicts as verify


def task() -> verify.VerificationTask:
    return verify.VerificationTask(arithmetic.Arithmetic(digits=2, ops="+", held_out=50, seed=0))


def test_samples_are_about_half_right_and_say_so_in_their_answer() -> None:
    judge, rng = task(), random.Random(3)
    samples = [judge.sample(rng) for _ in range(400)]
    yes = [s for s in samples if verify.truth(s)]
    assert 160 < len(yes) < 240
    for sample in samples:
        problem_prompt, candidate = sample.prompt.rstrip("?").split("=")
        a, b = (int(x) for x in problem_prompt.split("+"))
        assert (int(candidate) == a + b) == verify.truth(sample), sample
        # The target is the verifier's working (the right sum, whatever the candidate), then
        # the verdict.
        assert sample.answer[:-1] == str(a + b), sample


def test_a_near_miss_differs_from_the_answer_in_its_last_digit_only() -> None:
    rng = random.Random(0)
    base = arithmetic.Arithmetic(digits=2, ops="+", held_out=50, seed=0)
    for problem in base.held_out():
        wrong = task_base.near_miss(problem, rng)
        assert wrong != problem.answer
        assert wrong[:-1] == problem.answer[:-1]


def test_an_arithmetic_near_miss_changes_the_ones_digit_wherever_it_is_written() -> None:
    rng = random.Random(0)
    for reverse in (False, True):
        task = arithmetic.Arithmetic(digits=2, ops="+-", held_out=200, seed=0, reverse=reverse)
        judge = verify.VerificationTask(task)
        for problem in task.held_out():
            wrong = task.near_miss(problem, rng)
            assert task.reward(problem, wrong) == 0.0
            ones = 0 if not problem.answer.startswith("-") else 1
            ones = ones if reverse else len(problem.answer) - 1
            assert (
                wrong[:ones] + wrong[ones + 1 :]
                == problem.answer[:ones] + problem.answer[ones + 1 :]
            )
        wrong_ones = [p for p in judge.held_out() if not verify.truth(p)]
        plain = {p.prompt.split("=")[0]: p.answer for p in task.held_out()}
        for judged in wrong_ones:
            prompt, candidate = judged.prompt.rstrip("?").split("=")
            assert candidate != plain[prompt]
            assert len(candidate) == len(plain[prompt])


def test_the_reward_is_the_verdict_agreeing_with_the_truth() -> None:
    judge = task()
    right, wrong = judge.held_out()[:2]
    assert (verify.truth(right), verify.truth(wrong)) == (True, False)
    assert judge.reward(right, right.answer) == 1.0
    assert judge.reward(right, "y") == 1.0
    assert judge.reward(right, "n") == 0.0
    assert judge.reward(wrong, " n") == 1.0
    # Only the verdict is judged: wrong working before a right verdict still earns the reward.
    assert judge.reward(wrong, "99n") == 1.0
    assert judge.reward(right, "99n") == 0.0
    assert judge.reward(wrong, "maybe") == 0.0


def test_held_out_shows_each_held_out_problem_right_and_wrong() -> None:
    judge = task()
    held = judge.held_out()
    assert len(held) == 2 * len(judge.task.held_out())
    assert [verify.truth(p) for p in held[:4]] == [True, False, True, False]
    first = judge.task.held_out()[0]
    assert [p.answer for p in held[:2]] == [first.answer + verify.YES, first.answer + verify.NO]


def test_the_solver_warms_up_on_answers_and_the_verifier_on_verdicts() -> None:
    from polyrl.api.resources import RLJobSpec
    from polyrl.workers.workflows import interface as roles

    def spec(workflow: str, policies: int = 2) -> RLJobSpec:
        return RLJobSpec.model_validate(
            {
                "policies": [
                    {"name": name, "model": {"path": f"tiny-llama://{name}"}}
                    for name in ("solver", "verifier")[:policies]
                ],
                "workflow": {"name": workflow, "task": {"name": "arithmetic"}},
            }
        )

    arith = task().task
    both = roles.resolve(roles.load_workflow("solver-verifier"), spec("solver-verifier"), arith)
    assert both["solver"].warmup is arith
    assert isinstance(both["verifier"].warmup, verify.VerificationTask)
    assert both["verifier"].max_new_tokens == verify.verifier_max_new_tokens(16)
    one = roles.resolve(roles.load_workflow("single"), spec("single", 1), arith)
    assert one["solver"].warmup is arith


def test_a_case_of_a_given_answer_is_judged_by_the_tasks_check() -> None:
    judge = task()
    problem = judge.task.held_out()[0]
    a, b = (int(x) for x in problem.prompt.rstrip("=").split("+"))
    right, wrong = judge.case(problem, str(a + b)), judge.case(problem, str(a + b + 10))
    assert right.prompt == f"{a}+{b}={a + b}?"
    assert wrong.prompt == f"{a}+{b}={a + b + 10}?"
    assert (verify.truth(right), verify.truth(wrong)) == (True, False)
    # Either way the target's working is the right sum.
    assert right.answer[:-1] == wrong.answer[:-1] == str(a + b)


CHAT = {
    "messages": [
        {"role": "system", "content": "You check answers."},
        {"role": "user", "content": "Problem: {problem}\nProposed answer: {candidate}"},
    ],
    "answer": "The answer is {working}. \\boxed{{verdict}}",
    "verdictPattern": r"\\boxed\{(\w+)\}",
}


def chat_judge() -> verify.VerificationTask:
    spec = VerifierSpec.model_validate(CHAT)
    base_task = arithmetic.Arithmetic(digits=2, ops="+", held_out=50, seed=0)
    return verify.VerificationTask(base_task, verify.ChatVerdicts(spec))


def test_a_chat_verifier_is_asked_through_its_messages_and_warms_up_on_worked_verdicts() -> None:
    judge, rng = chat_judge(), random.Random(1)
    samples = [judge.sample(rng) for _ in range(100)]
    for sample in samples:
        assert sample.messages is not None
        system, user = sample.messages
        assert system == {"role": "system", "content": "You check answers."}
        problem_text, candidate = (
            user["content"].removeprefix("Problem: ").split("\nProposed answer: ")
        )
        a, b = (int(x) for x in problem_text.rstrip("=").split("+"))
        assert (int(candidate) == a + b) == verify.truth(sample)
        word = "yes" if verify.truth(sample) else "no"
        assert sample.answer == f"The answer is {a + b}. \\boxed{{{word}}}"
        # Its own target earns the reward; the other verdict, or none, does not.
        assert judge.reward(sample, sample.answer) == 1.0
        flipped = sample.answer.replace("{yes}", "{x}").replace("{no}", "{yes}")
        assert judge.reward(sample, flipped.replace("{x}", "{no}")) == 0.0
        assert judge.reward(sample, f"The answer is {a + b}.") == 0.0
    assert 30 < sum(map(verify.truth, samples)) < 70


def test_the_chat_verdict_is_the_patterns_last_match_in_either_case() -> None:
    judge = chat_judge()
    parse = judge.verdicts.parse
    assert parse("\\boxed{no} then again \\boxed{YES}") is True
    assert parse("\\boxed{maybe}") is None
    assert parse("no box at all: yes") is None


def test_a_verifier_template_that_cannot_read_its_own_answer_is_refused() -> None:
    bad = {**CHAT, "answer": "{working} so: {verdict}"}
    with pytest.raises(ValidationError, match="cannot read its own answer template"):
        VerifierSpec.model_validate(bad)
    with pytest.raises(ValidationError, match="put \\{candidate\\}"):
        VerifierSpec.model_validate(
            {**CHAT, "messages": [{"role": "user", "content": "{problem}"}]}
        )
    with pytest.raises(ValidationError, match="needs a group"):
        VerifierSpec.model_validate({**CHAT, "verdictPattern": "boxed"})
    with pytest.raises(ValidationError, match="does not compile"):
        VerifierSpec.model_validate({**CHAT, "verdictPattern": "(unclosed"})
