"""The solver-verifier's evaluations: the verifier's exam of the solver's own answers, judged."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from polyrl.api.resources import ModelSource, TaskSpec
from polyrl.workers import tasks
from polyrl.workers.models import loading as models
from polyrl.workers.trainer.scoring import ModelScorer
from polyrl.workers.workflows.solver_verifier import evaluation, exam, verdicts

TASK = tasks.load_task(TaskSpec(name="arithmetic"))


def scorer(tmp_path: Path, name: str) -> ModelScorer:
    model, tokenizer = models.make_model(
        ModelSource(path=f"tiny-llama://{name}", dtype="float32"), cache_dir=tmp_path
    )
    return ModelScorer(model, tokenizer, max_new_tokens=5, answer_tokens=4)


def test_the_exam_holds_the_solvers_answers_each_right_or_wrong_by_the_task() -> None:
    problems = exam.problems(TASK)
    assert len(problems) == exam.EXAM_PROBLEMS
    answers = [p.answer if i % 2 else "0" for i, p in enumerate(problems)]
    cases = exam.cases(
        verdicts.VerificationTask(TASK), exam.decode(exam.encode(answers), "solver") or []
    )
    assert len(cases) == len(answers)
    for problem, answer, case in zip(problems, answers, cases, strict=True):
        assert case.prompt == verdicts.verify_prompt(problem, answer)
        assert verdicts.truth(case) == (TASK.reward(problem, answer) > 0.5)


def test_malformed_or_missing_answers_give_no_exam_and_say_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="polyrl.exam"):
        assert exam.decode(None, "solver") is None
        assert exam.decode(b'{"answers": [1, 2]}', "solver") is None
        assert exam.decode(b"not json", "solver") is None
    assert "published no answers" in caplog.text
    assert "not a list of strings" in caplog.text
    assert "malformed" in caplog.text


def test_the_verifiers_figure_on_the_exam_is_its_headline_once_it_has_one(
    tmp_path: Path,
) -> None:
    judge = evaluation.VerifierEvaluation(TASK, "solver")
    looked = scorer(tmp_path, "exam-verifier")
    assert judge.headline == "balanced_accuracy"
    without = judge.evaluate(looked)
    assert set(without) == {"balanced_accuracy"}
    problems = TASK.held_out()[:4]
    judge.exam = [
        verdicts.VerificationTask(TASK).case(p, a) for p in problems for a in (p.answer, "0")
    ]
    assert judge.headline == "answers_balanced_accuracy"
    figures = judge.evaluate(looked)
    assert 0.0 <= figures["answers_balanced_accuracy"] <= 1.0


def test_a_balanced_figure_needs_at_least_one_case(tmp_path: Path) -> None:
    judge = verdicts.VerificationTask(TASK)
    with pytest.raises(ValueError, match="at least one case"):
        evaluation.balanced(scorer(tmp_path, "exam-verifier"), judge, [])
