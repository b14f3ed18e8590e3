"""What can be checked of a job before any work starts, and is, by whoever starts it.

A workflow runner loads the job's workflow and task before it connects to anything; a
trainer checks its model path and its policy's role before its rendezvous; `polyrl run`
checks all of it before it starts a process. A name that resolves to nothing, a path that is
not a causal language model, or a trainer field that cannot take effect for its policy
(`roles.problems`) is a `ConfigError` naming the policy and the cause: the worker exits 2
saying so (the operator fails the job, quoting it), `polyrl run` prints it and starts
nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from polyrl.api.resources import PolicySpec, RLJobSpec
from polyrl.workers import roles as policy_roles
from polyrl.workers import tasks
from polyrl.workers.errors import ConfigError

log = logging.getLogger("polyrl.preflight")


def workflow_and_task(spec: RLJobSpec) -> tuple[policy_roles.Workflow, tasks.Task]:
    """The job's workflow and task, loaded (importing a `module:function` entry point), and
    checked to fit each other and the job's trainer fields."""
    try:
        workflow = policy_roles.load_workflow(spec.workflow.name)
        task = tasks.load_task(spec.workflow.task)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if found := policy_roles.problems(workflow, spec, task):
        raise ConfigError("; ".join(found))
    return workflow, task


def roles(spec: RLJobSpec) -> dict[str, policy_roles.PolicyRole]:
    """Every policy's role in the job's workflow (see `roles.resolve`)."""
    workflow, task = workflow_and_task(spec)
    return policy_roles.resolve(workflow, spec, task)


def policy_model(policy: PolicySpec, *, cache_dir: Path | None = None) -> None:
    """`policy`'s model can be trained (config and tokenizer only, no weights); a warning in
    the log when its trainer's declared memory is below what the model needs (`memory`)."""
    from polyrl.workers import memory, model  # transformers: not for the workflow runner

    try:
        model.check_source(policy.model, cache_dir=cache_dir)
        config = model.source_config(policy.model, cache_dir=cache_dir or Path())
    except ValueError as err:
        raise ConfigError(f"policy {policy.name!r}: {err}") from None
    if config is not None and (short := memory.shortfall(policy, memory.parameters(config))):
        log.warning("%s", short)


def job(spec: RLJobSpec) -> None:
    """Everything above, for the whole job."""
    workflow_and_task(spec)
    for policy in spec.policies:
        policy_model(policy)
