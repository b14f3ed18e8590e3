"""LLM-as-judge: a frozen policy scores a trained policy's answers (docs/workflows.md,
"Frozen policies and judges").

Each episode: the solver answers a sum, in a group; the judge, a policy served without a
trainer (`frozen: true`), is asked of each answer whether it is right, and its yes or no is
the answer's reward. The exact reward (the task's own check) is never trained on here: it
is what the judge is measured against, reported as `agreement` (the share of verdicts that
match it) with the shares each calls right. A verdict that fails (too slow, no yes or no in
the judge's answer) drops the episode (reason `judge`), or gives workflow.judge.fallbackScore
where the job sets one, counted apart.

Used by examples/judge.yaml (tiny models) and examples/smollm2-judge.yaml as
`workflow.name: judge:Judged`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from polyrl.api.resources import RLJobSpec
from polyrl.workers.tasks import base
from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.interface import PolicyRole, TaskAccuracy

WORDS = re.compile(r"[a-z]+")


def judge_prompt(problem: base.Problem, answer: str) -> list[dict[str, str]]:
    """What the judge is shown: the problem, the answer, and the question."""
    asked = (
        f"Problem: {problem.prompt.strip()}\nProposed answer: {base.answer_text(answer)}\n"
        "Is the proposed answer correct? Reply with yes or no."
    )
    return [{"role": "user", "content": asked}]


def yes_or_no(text: str) -> float | None:
    """1 for the first "yes", 0 for the first "no" in the judge's answer, else no verdict."""
    for word in WORDS.findall(text.lower()):
        if word in ("yes", "no"):
            return 1.0 if word == "yes" else 0.0
    return None


@dataclass
class Tally:
    verdicts: int = 0
    agreed: int = 0
    judged_right: int = 0
    exactly_right: int = 0


class Judged:
    name = "judged"

    def __init__(self) -> None:
        self.tally = Tally()
        self.solver = self.judge = ""

    def roles(self, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
        trained = [p.name for p in spec.policies if not p.frozen]
        frozen = [p.name for p in spec.policies if p.frozen]
        if len(trained) != 1 or len(frozen) != 1:
            raise ValueError(
                f"it uses one trained policy and one frozen judge; the job trains {trained} "
                f"and freezes {frozen}"
            )
        [self.solver], [self.judge] = trained, frozen
        return {
            self.solver: PolicyRole("answers", task, TaskAccuracy(task)),
            self.judge: PolicyRole("judges"),
        }

    async def run(self, episode: Episode) -> None:
        problem = episode.task.sample(episode.rng)
        response = await episode.generate(self.solver, problem.request, episode.group_size)
        answers = [episode.text(response, i) for i in range(len(response.completions))]
        scores = await asyncio.gather(
            *(episode.judge(self.judge, judge_prompt(problem, a), yes_or_no) for a in answers)
        )  # a failed verdict raises: the whole episode is dropped, none of it emitted
        for i, (answer, score) in enumerate(zip(answers, scores, strict=True)):
            self._count(score, episode.task.reward(problem, answer))
            await episode.emit(self.solver, "answer", response, i, score)

    def _count(self, score: float, exact: float) -> None:
        tally = self.tally
        tally.verdicts += 1
        tally.agreed += (score > 0.5) == (exact > 0.5)
        tally.judged_right += score > 0.5
        tally.exactly_right += exact > 0.5

    def report(self) -> list[dict[str, Any]]:
        """How the judge's verdicts (fallback scores included) compare with the exact
        reward, since the last report."""
        tally, self.tally = self.tally, Tally()
        if not tally.verdicts:
            return []
        n = tally.verdicts
        return [
            {
                "source": "workflow",
                "policy": self.judge,
                "verdicts": n,
                "agreement": tally.agreed / n,
                "judged_right_share": tally.judged_right / n,
                "exactly_right_share": tally.exactly_right / n,
            }
        ]

    def flush(self) -> list[dict[str, Any]]:
        return self.report()
