"""The workflow interface: loading workflows, their declared roles, the manifest's sources,
and trainer fields that cannot take effect refused with the policy and field named."""

from __future__ import annotations

from typing import Any

import pytest

from polyrl.api.resources import RLJobSpec, Source, TaskSpec
from polyrl.workers import preflight, tasks
from polyrl.workers.errors import ConfigError
from polyrl.workers.workflows import interface as roles
from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.single import Single
from polyrl.workers.workflows.solver_verifier import SolverVerifier, verdicts


def spec(workflow: str, *names: str, **trainer: Any) -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "policies": [
                {"name": n, "model": {"path": f"tiny-llama://{n}"}, "trainer": trainer}
                for n in names
            ],
            "workflow": {"name": workflow, "task": {"name": "arithmetic"}},
        }
    )


async def plain(episode: Episode) -> None:
    """A workflow that is just a function (this module, as `module:function`)."""


class Declared:
    """A workflow object declaring a role for each policy."""

    name = "declared"

    def roles(self, spec: RLJobSpec, task: tasks.Task) -> dict[str, roles.PolicyRole]:
        return {
            p.name: roles.PolicyRole("answers", task, roles.TaskAccuracy(task))
            for p in spec.policies
        }

    async def run(self, episode: Episode) -> None:
        return None


def test_workflows_load_by_built_in_name_or_entry_point() -> None:
    assert isinstance(roles.load_workflow("single"), Single)
    assert isinstance(roles.load_workflow("solver-verifier"), SolverVerifier)
    function = roles.load_workflow(f"{__name__}:plain")
    assert isinstance(function, roles.FunctionWorkflow)
    assert isinstance(roles.load_workflow(f"{__name__}:Declared"), Declared)  # a class, made
    with pytest.raises(ValueError, match="unknown workflow 'nope'"):
        roles.load_workflow("nope")
    with pytest.raises(ValueError, match="cannot be loaded: No module named 'no_such_mod'"):
        roles.load_workflow("no_such_mod:fn")


def test_built_ins_declare_their_roles_and_refuse_jobs_of_another_shape() -> None:
    task = tasks.load_task(spec("single", "a").workflow.task)
    found = roles.resolve(SolverVerifier(), spec("solver-verifier", "s", "v"), task)
    assert (found["s"].role, found["v"].role) == ("answers", "judges the solver's answers")
    assert isinstance(found["v"].warmup, verdicts.VerificationTask)
    assert found["s"].evaluator is not None
    assert found["s"].evaluator.headline == "accuracy"
    assert roles.problems(SolverVerifier(), spec("solver-verifier", "a", "b", "c"), task) == [
        "workflow 'solver-verifier': it uses two policies (a solver, then a verifier); the job has 3"
    ]
    assert roles.problems(Single(), spec("single", "a", "b"), task) == [
        "workflow 'single': it uses one policy; the job has 2"
    ]


def test_a_plain_function_workflow_gets_a_warm_up_or_evaluation_only_where_asked() -> None:
    job = spec(f"{__name__}:plain", "p", "q")
    task = tasks.load_task(job.workflow.task)
    workflow = roles.load_workflow(job.workflow.name)
    nothing = roles.resolve(workflow, job, task)
    assert nothing["p"].warmup is None
    assert nothing["p"].evaluator is None
    job.policies[1].trainer.warmup.source = Source.TASK
    job.policies[1].trainer.eval.source = Source.TASK
    asked = roles.resolve(workflow, job, task)
    assert asked["q"].warmup is task
    assert isinstance(asked["q"].evaluator, roles.TaskAccuracy)
    assert asked["p"].warmup is None


def test_trainer_fields_that_cannot_take_effect_are_refused_naming_policy_and_field() -> None:
    job = spec(f"{__name__}:plain", "planner", "solver", warmupSteps=30, evalEvery=10)
    job.policies[1].trainer.warmup.source = Source.TASK
    job.policies[1].trainer.eval.source = Source.TASK
    with pytest.raises(ConfigError) as err:
        preflight.workflow_and_task(job)
    said = str(err.value)
    assert "policy 'planner': trainer.warmupSteps is 30 but there are no warm-up examples" in said
    assert "policy 'planner': trainer.evalEvery is 10 but there is no evaluation" in said
    assert "'solver'" not in said  # the policy that asked for the task's examples is fine


def test_a_workflow_may_override_nothing_and_the_manifest_may_turn_its_warm_up_off() -> None:
    job = spec(f"{__name__}:Declared", "a", warmupSteps=5)
    task = tasks.load_task(job.workflow.task)
    assert roles.problems(Declared(), job, task) == []
    job.policies[0].trainer.warmup.source = Source.NONE
    assert "trainer.warmupSteps is 5" in roles.problems(Declared(), job, task)[0]


def test_the_one_policy_workflow_in_the_docs_declares_its_role_and_runs_an_episode() -> None:
    import asyncio
    import random
    import re
    from pathlib import Path

    from polyrl.api.wire import Completion, GenerationResponse

    doc = (Path(__file__).resolve().parents[3] / "docs" / "workflows.md").read_text()
    code = re.search(r"A whole workflow with one policy.*?```python\n(.*?)```", doc, re.S)
    assert code is not None, "docs/workflows.md lost its one-policy workflow"
    scope: dict[str, Any] = {"PolicyRole": roles.PolicyRole, "TaskAccuracy": roles.TaskAccuracy}
    exec(code.group(1), scope)
    workflow = scope["Answer"]()
    job = spec("x", "solver", warmupSteps=10, evalEvery=5)
    task = tasks.load_task(job.workflow.task)
    assert roles.problems(workflow, job, task) == []  # both fields take effect
    sent: list[float] = []

    async def generate(policy: str, prompt: Any, n: int, limit: int) -> GenerationResponse:
        answer = str(eval(prompt.removesuffix("=")))  # the right answer, then wrong ones
        texts = [answer, "x", "y", "z"][:n]
        done = [Completion(tokens=[1], logprobs=[0.0], text=t, finish_reason="stop") for t in texts]
        return GenerationResponse(
            id="r", pod="p", weight_version=0, prompt_tokens=[1], completions=done
        )

    async def emit(policy: str, group: str, response: Any, index: int, reward: float) -> None:
        sent.append(reward)

    episode = Episode("e", job, task, random.Random(0), generate, emit)
    asyncio.run(workflow.run(episode))
    assert sent == [1.0, 0.0, 0.0, 0.0]


class ScriptedPool:
    """A stand-in for the rollout pool's scorer: answers from a script, to check the
    arithmetic of pass@k (the pool itself is tested in test_rollout_worker)."""

    max_new_tokens = answer_tokens = 4
    samples = 4

    def __init__(self, greedy: dict[str, str], sampled: dict[str, list[str]]) -> None:
        self.answers, self.samples_of = greedy, sampled

    def greedy(self, prompts: Any, *, max_new_tokens: int | None = None) -> list[str]:
        return [self.answers[p] for p in prompts]

    def sampled(
        self, prompts: Any, *, n: int, max_new_tokens: int | None = None
    ) -> list[list[str]]:
        assert n == self.samples
        return [self.samples_of[p] for p in prompts]

    def accuracy(self, problems: Any, *, reward: Any, max_new_tokens: int | None = None) -> float:
        texts = self.greedy([p.request for p in problems])
        return float(sum(reward(p, t) for p, t in zip(problems, texts, strict=True))) / len(
            problems
        )


def test_task_accuracy_reports_pass_at_1_and_pass_at_k_where_the_scorer_samples() -> None:
    task = tasks.load_task(TaskSpec(name="arithmetic", params={"digits": 1}, held_out=2))
    first, second = task.held_out()
    pool = ScriptedPool(
        {first.prompt: first.answer, second.prompt: "x"},
        {first.prompt: [first.answer] * 4, second.prompt: ["x", "x", second.answer, "x"]},
    )
    figures = roles.TaskAccuracy(task).evaluate(pool)
    assert figures == {"accuracy": 0.5, "pass_at_1": 5 / 8, "pass_at_4": 1.0}
    pool.samples = 0  # greedy only
    assert roles.TaskAccuracy(task).evaluate(pool) == {"accuracy": 0.5}
