"""Multi-policy workflows: how one episode calls the policies and rewards each of them.

A workflow is an object with a `name`, `roles(spec, task)` (what each of its policies does:
warm-up examples, evaluation; see `interface.PolicyRole`) and `async run(episode)`, which asks
policies for completions through `episode.generate` and hands every sample with its reward
to `episode.emit`; or simply an `async def workflow(episode)`, which declares no roles.
Built-ins: `single` and `solver-verifier`, written against the same interface; a job names
any `module:attribute` instead. docs/workflows.md shows how to write one.
"""

from __future__ import annotations

from polyrl.workers.workflows.episode import Episode
from polyrl.workers.workflows.interface import (
    BUILTIN,
    Evaluator,
    Handoff,
    PolicyRole,
    TaskAccuracy,
    Workflow,
    load_workflow,
)

__all__ = [
    "BUILTIN",
    "Episode",
    "Evaluator",
    "Handoff",
    "PolicyRole",
    "TaskAccuracy",
    "Workflow",
    "load_workflow",
]
