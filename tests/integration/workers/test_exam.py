"""The verifier's exam travels from the solver's trainer to the verifier's through NATS."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from polyrl.api.launch import Role, WorkerConfig
from polyrl.api.resources import ModelSource, RLJobSpec, TaskSpec
from polyrl.local.natsserver import NatsServer
from polyrl.workers import tasks
from polyrl.workers.models import loading as models
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.trainer.leader import NatsHandoff
from polyrl.workers.trainer.scoring import ModelScorer
from polyrl.workers.workflows.solver_verifier import evaluation, exam, verdicts

TASK = tasks.load_task(TaskSpec(name="arithmetic"))
SPEC = RLJobSpec.model_validate(
    {
        "policies": [
            {"name": "solver", "model": {"path": "tiny-llama://exam-solver"}},
            {"name": "verifier", "model": {"path": "tiny-llama://exam-verifier"}},
        ],
        "workflow": {"name": "solver-verifier"},
        "algorithm": {"maxNewTokens": 4},
    }
)


async def runtime(url: str, job: str, policy: str) -> Runtime:
    config = WorkerConfig(
        namespace="t", job=job, role=Role.TRAINER, policy=policy, nats_url=url, spec=SPEC
    )
    return await Runtime.connect(config, f"{policy}-trainer-0")


async def test_the_solver_sets_the_exam_and_the_verifier_takes_it(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    solver_rt = await runtime(nats_server.url, "exam", "solver")
    verifier_rt = await runtime(nats_server.url, "exam", "verifier")
    model, tokenizer = models.make_model(
        ModelSource(path="tiny-llama://exam-solver", dtype="float32"), cache_dir=tmp_path
    )
    solver = ModelScorer(model, tokenizer, max_new_tokens=4, answer_tokens=4)
    try:
        await evaluation.SolverEvaluation(TASK).prepare(
            NatsHandoff(solver_rt, "solver"), solver, first=True
        )
        judge = evaluation.VerifierEvaluation(TASK, "solver")
        await judge.prepare(NatsHandoff(verifier_rt, "verifier"), solver, first=True)
    finally:
        await solver_rt.close()
        await verifier_rt.close()
    answers = solver.greedy([p.prompt for p in exam.problems(TASK)[:20]])
    assert len(judge.exam) == exam.EXAM_PROBLEMS
    assert [c.prompt for c in judge.exam[:20]] == [
        c.prompt for c in exam.cases(verdicts.VerificationTask(TASK), answers)
    ]


async def test_without_answers_the_verifier_goes_without_an_exam_and_says_why(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(exam, "TIMEOUT_SECONDS", 1.0)
    rt = await runtime(nats_server.url, "noexam", "verifier")
    judge = evaluation.VerifierEvaluation(TASK, "solver")
    try:
        with caplog.at_level(logging.WARNING, logger="polyrl.exam"):
            await judge.prepare(NatsHandoff(rt, "verifier"), None, first=True)  # type: ignore[arg-type]
    finally:
        await rt.close()
    assert judge.exam == []
    assert judge.headline == "balanced_accuracy"
    assert "published no answers" in caplog.text
