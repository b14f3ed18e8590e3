"""The workflow interface: what a workflow runs, and what it says about each of its policies.

A workflow runs episodes (`run(episode)`) and declares, for each policy it uses, a
`PolicyRole`: what the policy does in it, where its supervised warm-up examples come from
(a task whose problems pair a prompt with the reference completion), how it is evaluated
(an `Evaluator`: held-out figures, one of them the headline), and what runs before RL (an
`Evaluator.prepare`, such as the solver-verifier's exam, which one policy's trainer hands to
another's). The trainer and the workflow runner read these through this module only: it
loads workflows by name (`load_workflow`), so nothing generic imports a workflow, and
`resolve` applies the manifest (`trainer.warmup.source`, `trainer.eval.source`) on top.

A plain `async def workflow(episode)` is a workflow too (`FunctionWorkflow`): it declares
nothing, so its policies get a warm-up or an evaluation only where the manifest asks for one
on the task (`source: task`). A trainer field that cannot take effect (warm-up steps with no
examples, `evalEvery` with no evaluation) is refused before anything starts (`problems`),
naming the policy and the field.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from polyrl.api.resources import PolicySpec, RLJobSpec, Source
from polyrl.workers.tasks import base

if TYPE_CHECKING:
    from polyrl.workers.workflows.episode import Episode

# Built-in workflows by name, as import paths: loading one imports it, nothing else does.
BUILTIN = {
    "single": "polyrl.workers.workflows.single:Single",
    "solver-verifier": "polyrl.workers.workflows.solver_verifier:SolverVerifier",
}


class Handoff(Protocol):
    """What one policy's trainer can pass another's before RL, through the job's NATS."""

    async def publish(self, name: str, data: bytes) -> None:
        """Put `data` under `name`, beside this policy's weights."""

    async def fetch(self, policy: str, name: str, *, timeout: float) -> bytes | None:
        """What `policy`'s trainer put under `name`, waiting up to `timeout` s; else None."""


class Scorer(Protocol):
    """What an evaluator gets to ask of a policy's model: greedy answers and their accuracy,
    within the policy's generation budget. The trainer gives one over its live model
    (`polyrl.workers.trainer.scoring.ModelScorer`); the interface names only the questions."""

    max_new_tokens: int
    """The policy's generation budget (`budget`)."""
    answer_tokens: int
    """An answer's budget, algorithm.maxNewTokens (a verifier's working is one)."""

    def greedy(
        self,
        prompts: Sequence[str | Sequence[Mapping[str, str]]],
        *,
        max_new_tokens: int | None = None,
    ) -> list[str]:
        """Greedy completions of `prompts`, in the policy's budget unless told otherwise."""
        ...

    def accuracy(
        self,
        problems: Sequence[base.Problem],
        *,
        reward: Callable[[base.Problem, str], float],
        max_new_tokens: int | None = None,
    ) -> float:
        """The mean `reward` of greedy completions of `problems`."""
        ...


@runtime_checkable
class SamplingScorer(Scorer, Protocol):
    """A scorer that can also sample (the rollout pool's, `trainer.evalOn: rollout`), for
    pass@k: `samples` completions per problem at the policy's temperature (0: none asked)."""

    samples: int

    def sampled(
        self,
        prompts: Sequence[str | Sequence[Mapping[str, str]]],
        *,
        n: int,
        max_new_tokens: int | None = None,
    ) -> list[list[str]]:
        """`n` sampled completions of each prompt."""
        ...


class Evaluator(Protocol):
    """How a policy is evaluated: held-out figures from its greedy answers."""

    @property
    def headline(self) -> str:
        """The figure plots, the progress line and status lead with (a key of `evaluate`'s)."""

    async def prepare(self, handoff: Handoff, scorer: Scorer, *, first: bool) -> None:
        """What runs before RL, once the warm-up is done (`first`: not a resumed trainer)."""

    def evaluate(self, scorer: Scorer) -> dict[str, float]:
        """The held-out figures, the headline among them."""


@dataclass(frozen=True, slots=True)
class PolicyRole:
    """What a workflow says about one of its policies."""

    role: str
    """What the policy does in the workflow, in a word or two ("answers", "judges")."""
    warmup: base.Task | None = None
    """Supervised warm-up examples (each problem's prompt, then its answer); None: none."""
    evaluator: Evaluator | None = None
    """Held-out evaluation; None: none."""
    max_new_tokens: int | None = None
    """The policy's generation budget where it differs from algorithm.maxNewTokens."""


@runtime_checkable
class Workflow(Protocol):
    """A multi-policy workflow (see the module docstring)."""

    name: str

    def roles(self, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
        """Each policy's role, by name; raises ValueError when the job does not fit."""

    async def run(self, episode: Episode) -> None:
        """One episode: ask policies, reward each sample, emit them."""


@runtime_checkable
class Reports(Protocol):
    """A workflow that keeps figures across episodes (optional: the solver-verifier tallies
    how well its verifier judges); the runner writes them into the run's metrics."""

    def report(self) -> list[dict[str, Any]]:
        """Metric records to log now."""

    def flush(self) -> list[dict[str, Any]]:
        """Whatever records remain, at shutdown."""


class TaskAccuracy:
    """The default evaluation: greedy accuracy on the task's fixed held-out split."""

    headline = "accuracy"

    def __init__(self, task: base.Task, *, problems: int = 1000) -> None:
        self.task, self.problems = task, problems

    async def prepare(self, handoff: Handoff, scorer: Scorer, *, first: bool) -> None:
        return None

    def evaluate(self, scorer: Scorer) -> dict[str, float]:
        held_out = self.task.held_out()[: self.problems]
        figures = {"accuracy": scorer.accuracy(held_out, reward=self.task.reward)}
        if isinstance(scorer, SamplingScorer) and scorer.samples > 0:
            figures |= pass_at(scorer, held_out, self.task.reward, scorer.samples)
        return figures


def pass_at(
    scorer: SamplingScorer,
    problems: Sequence[base.Problem],
    reward: Callable[[base.Problem, str], float],
    k: int,
) -> dict[str, float]:
    """pass_at_1 (the mean reward of k samples per problem: pass@1's unbiased estimate at the
    sampling temperature) and pass_at_k (the share of problems with a sample rewarded 1)."""
    texts = scorer.sampled([p.request for p in problems], n=k)
    rewards = [[reward(p, t) for t in row] for p, row in zip(problems, texts, strict=True)]
    return {
        "pass_at_1": sum(map(sum, rewards)) / (k * len(problems)),
        f"pass_at_{k}": sum(max(row) >= 1.0 for row in rewards) / len(problems),
    }


class FunctionWorkflow:
    """A plain `async def workflow(episode)`: it declares no roles."""

    def __init__(self, fn: Callable[[Episode], Awaitable[None]], name: str) -> None:
        self.fn, self.name = fn, name

    def roles(self, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
        return {}

    async def run(self, episode: Episode) -> None:
        await self.fn(episode)


def load_workflow(name: str) -> Workflow:
    """A built-in by name, or a `module:attribute` entry point: a Workflow (class or
    instance) or a plain async function; a clear ValueError otherwise."""
    path = BUILTIN.get(name, name)
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown workflow {name!r}: use {sorted(BUILTIN)} or 'module:function'")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"workflow entry point {name!r} cannot be loaded: {err}") from None
    if isinstance(found, type):
        found = found()
    if isinstance(found, Workflow):
        return found  # (an object with name, roles and run)
    if callable(found):
        return FunctionWorkflow(found, name)
    raise ValueError(f"workflow entry point {name!r} is neither a Workflow nor a function")


def resolve(workflow: Workflow, spec: RLJobSpec, task: base.Task) -> dict[str, PolicyRole]:
    """Every policy's role, the manifest's warm-up and evaluation sources applied."""
    declared = workflow.roles(spec, task)
    return {p.name: _with_sources(declared.get(p.name), p, task) for p in spec.policies}


def _with_sources(declared: PolicyRole | None, policy: PolicySpec, task: base.Task) -> PolicyRole:
    role = declared or PolicyRole(role="unnamed")
    warmup = {Source.WORKFLOW: role.warmup, Source.TASK: task, Source.NONE: None}
    evaluator = {
        Source.WORKFLOW: role.evaluator,
        Source.TASK: TaskAccuracy(task),
        Source.NONE: None,
    }
    return PolicyRole(
        role=role.role,
        warmup=warmup[Source(policy.trainer.warmup.source)],
        evaluator=evaluator[Source(policy.trainer.eval.source)],
        max_new_tokens=role.max_new_tokens,
    )


def problems(workflow: Workflow, spec: RLJobSpec, task: base.Task) -> list[str]:
    """Trainer fields the job sets that cannot take effect, each naming policy and field."""
    try:
        roles = resolve(workflow, spec, task)
    except ValueError as err:
        return [f"workflow {workflow.name!r}: {err}"]
    found = []
    for policy in spec.policies:
        role, trainer = roles[policy.name], policy.trainer
        why = f"workflow {workflow.name!r} gives policy {policy.name!r} none"
        if role.warmup is None and trainer.warmup_steps:
            found.append(
                f"policy {policy.name!r}: trainer.warmupSteps is {trainer.warmup_steps} but "
                f"there are no warm-up examples ({why}); set trainer.warmup.source: task, or "
                "remove warmupSteps"
            )
        if role.evaluator is None and trainer.eval_every:
            found.append(
                f"policy {policy.name!r}: trainer.evalEvery is {trainer.eval_every} but there "
                f"is no evaluation ({why}); set trainer.eval.source: task, or remove evalEvery"
            )
    return found


def budget(role: PolicyRole, spec: RLJobSpec, policy: PolicySpec | None = None) -> int:
    """A policy's generation budget: its own (`maxNewTokens`), else its role's, else the job's."""
    own = policy.max_new_tokens if policy is not None else None
    return own or role.max_new_tokens or spec.algorithm.max_new_tokens


__all__ = [
    "BUILTIN",
    "Evaluator",
    "FunctionWorkflow",
    "Handoff",
    "PolicyRole",
    "Reports",
    "Scorer",
    "TaskAccuracy",
    "Workflow",
    "budget",
    "load_workflow",
    "problems",
    "resolve",
]
