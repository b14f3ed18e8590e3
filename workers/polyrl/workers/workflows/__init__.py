"""Multi-policy workflows: how one episode calls the policies and rewards each of them.

A workflow is an async function `workflow(episode: Episode) -> None` that samples or is given
a problem, asks policies for completions through `episode.generate`, and hands every sample
with its reward to `episode.emit`. Built-ins are `single` and `solver-verifier`; a job can
name any `module:function` with that signature instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable

from polyrl.workers.workflows.builtin import single, solver_verifier
from polyrl.workers.workflows.episode import Episode

Workflow = Callable[[Episode], Awaitable[None]]

BUILTIN: dict[str, Workflow] = {"single": single, "solver-verifier": solver_verifier}


def load_workflow(name: str) -> Workflow:
    """A built-in by name, or a `module:function` entry point; a clear error otherwise."""
    if name in BUILTIN:
        return BUILTIN[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown workflow {name!r}: use {sorted(BUILTIN)} or 'module:function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"workflow entry point {name!r} cannot be loaded: {err}") from None
    if not callable(fn):
        raise ValueError(f"workflow entry point {name!r} is not callable")
    workflow: Workflow = fn
    return workflow


__all__ = ["BUILTIN", "Episode", "Workflow", "load_workflow"]
