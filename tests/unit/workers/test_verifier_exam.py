"""The solver-verifier's evaluations: the verifier's exam of the solver's own answers, judged."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from polyrl.api.resources import ModelSource, TaskSpec
from polyrl.workers import tasks
from polyrl.workers.models import loading as models
from polyrl.workers.tasks import base
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


def exam_cases() -> list[base.Problem]:
    """Four held-out problems, each with its answer (right) and with "0" (wrong)."""
    judge = verdicts.VerificationTask(TASK)
    cases = [judge.case(p, a) for p in TASK.held_out()[:4] for a in (p.answer, "0")]
    assert [verdicts.truth(c) for c in cases] == [True, False] * 4
    return cases


def test_the_verifiers_figure_on_the_exam_is_its_headline_once_it_has_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evaluation, "VERIFIER_PROBLEMS", 2)  # 4 near-miss verdicts, not 1,000
    judge = evaluation.VerifierEvaluation(TASK, "solver")
    looked = scorer(tmp_path, "exam-verifier")
    assert judge.headline == "balanced_accuracy"
    without = judge.evaluate(looked)
    assert set(without) == {"balanced_accuracy"}
    judge.exam = exam_cases()
    assert judge.headline == "answers_balanced_accuracy"
    figures = judge.evaluate(looked)
    assert figures["balanced_accuracy"] == without["balanced_accuracy"]  # the exam adds a figure
    # The exam's figure is the mean of the verifier's hit rates on the right and on the wrong
    # answers, each from its own greedy verdicts on them.
    rates = []
    for right in (True, False):
        shown = [c for c in judge.exam if verdicts.truth(c) == right]
        said = looked.greedy([c.request for c in shown])
        rates.append(sum(map(judge.judge.reward, shown, said)) / len(shown))
    assert figures["answers_balanced_accuracy"] == sum(rates) / 2


class Says:
    """A verifier that writes the same completion whatever it is shown."""

    max_new_tokens = 5
    answer_tokens = 4

    def __init__(self, completion: str) -> None:
        self.completion = completion

    def greedy(
        self,
        prompts: Sequence[str | Sequence[Mapping[str, str]]],
        *,
        max_new_tokens: int | None = None,
    ) -> list[str]:
        return [self.completion] * len(prompts)

    def accuracy(
        self,
        problems: Sequence[base.Problem],
        *,
        reward: Callable[[base.Problem, str], float],
        max_new_tokens: int | None = None,
    ) -> float:
        said = self.greedy([p.request for p in problems])
        return sum(map(reward, problems, said)) / len(problems)


@pytest.mark.parametrize(("says", "figure"), [("12y", 0.5), ("12n", 0.5), ("12", 0.0)])
def test_a_verifier_that_says_the_same_whatever_it_is_shown_scores_chance_or_nothing(
    says: str, figure: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Always "y" (or always "n") is right on one kind of candidate and wrong on the other, so
    # weighing the kinds equally gives exactly 0.5; no verdict at all is wrong on both.
    monkeypatch.setattr(evaluation, "VERIFIER_PROBLEMS", 50)
    judge = evaluation.VerifierEvaluation(TASK, "solver")
    judge.exam = exam_cases()
    assert judge.evaluate(Says(says)) == {
        "balanced_accuracy": figure,
        "answers_balanced_accuracy": figure,
    }


def test_a_balanced_figure_needs_at_least_one_case(tmp_path: Path) -> None:
    judge = verdicts.VerificationTask(TASK)
    with pytest.raises(ValueError, match="at least one case"):
        evaluation.balanced(scorer(tmp_path, "exam-verifier"), judge, [])
