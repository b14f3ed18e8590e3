"""Turn a job's `TaskSpec` into a `Task`: a built-in name or a `module:function` entry point.

Every task, built-in or not, comes from a factory called the same way:
`factory(params, held_out=spec.held_out, seed=spec.seed)` returning a `Task`. A user's factory
thus receives the held-out size and seed the manifest asked for, and the workflow runner never
needs to know which kind it holds.

Mistakes in a manifest surface here, before any episode runs, as a ValueError that names the
offending entry, rather than as an AttributeError deep inside a runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polyrl.api.resources import TaskSpec
from polyrl.workers.tasks import arithmetic, base, countdown, dataset

TaskFactory = Callable[..., Any]
BUILT_IN: dict[str, TaskFactory] = {
    arithmetic.NAME: arithmetic.make,
    countdown.NAME: countdown.make,
    dataset.NAME: dataset.make,
}


def load_task(spec: TaskSpec) -> base.Task:
    """The task `spec` names, built with its params, held-out size and seed."""
    factory = BUILT_IN.get(spec.name) or _entry_point(spec.name)
    task = factory(dict(spec.params), held_out=spec.held_out, seed=spec.seed)
    if not isinstance(task, base.Task):
        raise ValueError(
            f"task entry point {spec.name!r} returned {type(task).__name__}, which lacks "
            "name, sample, reward or held_out"
        )
    return task


def _entry_point(name: str) -> TaskFactory:
    return base.entry_point(name, what="task", builtins=list(BUILT_IN))
