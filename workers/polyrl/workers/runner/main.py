"""Building the workflow runner: the job's workflow and task, loaded by name (`preflight`)."""

from __future__ import annotations

from polyrl.workers import preflight, tasks
from polyrl.workers.runner.runner import WorkflowRunner
from polyrl.workers.runtime.worker import Runtime
from polyrl.workers.workflows import Workflow


def build_workflow(
    rt: Runtime, workflow: Workflow | None = None, task: tasks.Task | None = None
) -> WorkflowRunner:
    """The workflow runner, with the job's workflow and task unless given (loaded)."""
    if workflow is None or task is None:
        workflow, task = preflight.workflow_and_task(rt.config.spec)
    spec = rt.config.spec
    per_runner = max(1, spec.workflow.episodes_in_flight // spec.workflow.replicas)
    return WorkflowRunner(rt, workflow, task, concurrency=per_runner)
