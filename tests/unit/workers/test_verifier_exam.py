"""The verifier's fixed exam: held-out problems with a solver's greedy answers, judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyrl.api.resources import ModelSource, RLJobSpec
from polyrl.workers import evaluation, tasks, trainer, warmup
from polyrl.workers import model as models
from polyrl.workers.tasks import verify


def spec() -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "policies": [
                {"name": "solver", "model": {"path": "tiny-llama://exam-solver"}},
                {
                    "name": "verifier",
                    "model": {"path": "tiny-llama://exam-verifier"},
                    "trainer": {"evalEvery": 10},
                },
            ],
            "workflow": {"name": "solver-verifier", "task": {"name": "arithmetic"}},
            "algorithm": {"maxNewTokens": 4},
        }
    )


def test_the_exam_holds_the_solvers_greedy_answers_right_or_wrong_by_the_task(
    tmp_path: Path,
) -> None:
    job = spec()
    solver, tokenizer = models.make_model(
        ModelSource(path="tiny-llama://exam-solver", dtype="float32"), cache_dir=tmp_path
    )
    answers = evaluation.solver_answers(solver, tokenizer, job)
    assert len(answers) == evaluation.VERIFIER_EVAL_PROBLEMS
    task = tasks.load_task(job.workflow.task)
    problems = task.held_out()[: len(answers)]
    assert answers[:20] == warmup.greedy_completions(
        solver, tokenizer, [p.prompt for p in problems[:20]], max_new_tokens=4
    )
    # An untrained solver is rarely right: give the exam some right answers too.
    answers[:10] = [p.answer for p in problems[:10]]
    cases = evaluation.exam_cases(answers, job)
    assert len(cases) == len(answers)
    for problem, answer, case in zip(problems, answers, cases, strict=True):
        assert case.prompt == verify.verify_prompt(problem, answer)
        assert verify.truth(case) == (task.reward(problem, answer) > 0.5)
    assert sum(map(verify.truth, cases)) >= 10


def test_the_verifiers_warmup_dev_is_as_many_right_as_wrong_of_the_solvers_own_answers() -> None:
    job = spec()
    task = tasks.load_task(job.workflow.task)
    problems = evaluation.dev_problems(task, job, 300)
    assert not {p.prompt for p in problems} & {p.prompt for p in task.held_out()}
    # Every third answer right, the rest off by one.
    answers = [p.answer if i % 3 == 0 else str(int(p.answer) + 1) for i, p in enumerate(problems)]
    dev = evaluation.verifier_dev(answers, job)
    side = evaluation.VERIFIER_DEV_PER_SIDE
    assert len(dev) == 2 * side
    assert [verify.truth(c) for c in dev] == [True] * side + [False] * side
    judge = verify.VerificationTask(task)
    assert dev[0] == judge.case(problems[0], answers[0])
    assert dev[side] == judge.case(problems[1], answers[1])
    assert dev[side + 1] == judge.case(problems[2], answers[2])


def test_a_solver_nearly_always_right_gives_no_warmup_dev_and_the_verifier_falls_back() -> None:
    job = spec()
    problems = evaluation.dev_problems(tasks.load_task(job.workflow.task), job, 400)
    few_wrong = evaluation.MIN_DEV_PER_SIDE - 1
    answers = [p.answer if i >= few_wrong else "-1" for i, p in enumerate(problems)]
    assert evaluation.verifier_dev(answers, job) == []
    answers[few_wrong] = "-1"  # one more wrong answer: enough
    assert len(evaluation.verifier_dev(answers, job)) == 2 * evaluation.MIN_DEV_PER_SIDE


def test_the_verifiers_warmup_measures_its_target_on_the_dev_cases_it_is_given(
    tmp_path: Path,
) -> None:
    job = spec()
    job.policies[1].trainer.warmup_steps = 10
    job.policies[1].trainer.warmup_target_accuracy = 0.99  # not reached: every check runs
    task = tasks.load_task(job.workflow.task)
    judge = verify.VerificationTask(task)
    dev = [judge.case(p, p.answer) for p in evaluation.dev_problems(task, job, 3)]
    given = evaluation.warm_start(
        trainer.Trainer(job.policies[1], job.algorithm, workdir=tmp_path / "given"), job, dev=dev
    )
    assert (given["dev_problems"], given["dev_from_solver"]) == (3.0, 1.0)
    assert given["steps"] == 10.0
    default = evaluation.warm_start(
        trainer.Trainer(job.policies[1], job.algorithm, workdir=tmp_path / "default"), job
    )
    assert (default["dev_problems"], default["dev_from_solver"]) == (
        float(evaluation.WARMUP_DEV_PROBLEMS),
        0.0,
    )


def test_the_verifiers_evaluation_adds_its_figure_on_the_exam_only_when_given_one(
    tmp_path: Path,
) -> None:
    job = spec()
    judge = trainer.Trainer(job.policies[1], job.algorithm, workdir=tmp_path)
    task = tasks.load_task(job.workflow.task)
    problems = task.held_out()[:4]
    exam = [verify.VerificationTask(task).case(p, p.answer) for p in problems] + [
        verify.VerificationTask(task).case(p, "0") for p in problems
    ]
    without = evaluation.evaluate(judge, job)
    assert "balanced_accuracy" in without
    assert "answers_balanced_accuracy" not in without
    figures = evaluation.evaluate(judge, job, exam=exam)
    assert 0.0 <= figures["answers_balanced_accuracy"] <= 1.0


def test_a_balanced_figure_needs_at_least_one_case(tmp_path: Path) -> None:
    job = spec()
    judge = trainer.Trainer(job.policies[1], job.algorithm, workdir=tmp_path)
    task = verify.VerificationTask(tasks.load_task(job.workflow.task))
    with pytest.raises(ValueError, match="at least one case"):
        warmup.balanced_verdict_accuracy(judge.model, judge.tokenizer, task, [], max_new_tokens=5)
