"""How the solver and the verifier are evaluated, and the exam that passes between them.

The solver: greedy accuracy on the task's held-out split (`workflows.interface.TaskAccuracy`); before RL it
publishes its answers for the verifier's exam. The verifier: balanced accuracy (the mean of
its hit rates on right and on wrong candidates, so always saying "y" scores 0.5) on held-out
problems shown with their answer and with a near miss, and on the exam of the solver's own
answers, its headline where there is one.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

from polyrl.workers.tasks import base
from polyrl.workers.workflows.interface import Handoff, Scorer, TaskAccuracy
from polyrl.workers.workflows.solver_verifier import exam, verdicts

log = logging.getLogger("polyrl.exam")
VERIFIER_PROBLEMS = 500  # each shown right and wrong: 1,000 verdicts


class SolverEvaluation(TaskAccuracy):
    """Held-out accuracy; before RL, the exam's answers for the verifier."""

    async def prepare(self, handoff: Handoff, scorer: Scorer, *, first: bool) -> None:
        if not first:
            return  # a resumed solver: the exam was set at the start of the job
        answers = scorer.greedy(
            [p.request for p in exam.problems(self.task)], max_new_tokens=scorer.answer_tokens
        )
        await handoff.publish(exam.OBJECT, exam.encode(answers))


class VerifierEvaluation:
    """Balanced accuracy on near misses, and on the exam once the solver has set it."""

    def __init__(
        self, task: base.Task, solver: str, fmt: verdicts.Verdicts = verdicts.CHARS
    ) -> None:
        self.task, self.solver = task, solver
        self.judge = verdicts.VerificationTask(task, fmt)
        self.exam: list[base.Problem] = []

    @property
    def headline(self) -> str:
        return "answers_balanced_accuracy" if self.exam else "balanced_accuracy"

    async def prepare(self, handoff: Handoff, scorer: Scorer, *, first: bool) -> None:
        data = await handoff.fetch(self.solver, exam.OBJECT, timeout=exam.TIMEOUT_SECONDS)
        answers = exam.decode(data, self.solver)
        self.exam = exam.cases(self.judge, answers) if answers else []
        right = sum(map(verdicts.truth, self.exam))
        log.info(
            "exam: %d of the %s's answers to judge, %d right", len(self.exam), self.solver, right
        )

    def evaluate(self, scorer: Scorer) -> dict[str, float]:
        rng = random.Random(0)
        held_out = self.task.held_out()[:VERIFIER_PROBLEMS]
        near = [self.judge.judged(p, right, rng) for p in held_out for right in (True, False)]
        figures = {"balanced_accuracy": balanced(scorer, self.judge, near)}
        if self.exam:
            figures["answers_balanced_accuracy"] = balanced(scorer, self.judge, self.exam)
        return figures


def balanced(
    scorer: Scorer, judge: verdicts.VerificationTask, cases: Sequence[base.Problem]
) -> float:
    """The mean of the verifier's greedy hit rates on the right and on the wrong candidates
    among `cases`, so that neither kind outweighs the other; no verdict counts as wrong."""
    rates = []
    for right in (True, False):
        subset = [c for c in cases if verdicts.truth(c) == right]
        if subset:
            rates.append(scorer.accuracy(subset, reward=judge.reward))
    if not rates:
        raise ValueError("balanced accuracy needs at least one case")
    return sum(rates) / len(rates)
