"""What can be checked of a job before any work starts, and is, by whoever starts it.

A workflow runner loads the job's workflow and task before it connects to anything; a
trainer checks its model path and its policy's role before its rendezvous; `polyrl run`
checks all of it before it starts a process. A name that resolves to nothing, a path that is
not a causal language model, or a trainer field that cannot take effect for its policy
(`workflows.interface.problems`) is a `ConfigError` naming the policy and the cause: the worker exits 2
saying so (the operator fails the job, quoting it), `polyrl run` prints it and starts
nothing.

A trainer pod runs `polyrl worker trainer torchrun ...` (`trainer_then`): these checks (with
`model_files`, which needs neither torch nor transformers) take seconds, where torchrun and
its ranks would first import torch, which on a busy node takes minutes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from polyrl.api.resources import PolicySpec, RLJobSpec
from polyrl.workers import tasks
from polyrl.workers.errors import ConfigError
from polyrl.workers.models import sources
from polyrl.workers.workflows import interface as policy_roles

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
    """Every policy's role in the job's workflow (see `workflows.interface.resolve`)."""
    workflow, task = workflow_and_task(spec)
    return policy_roles.resolve(workflow, spec, task)


def policy_model(policy: PolicySpec, *, cache_dir: Path | None = None) -> None:
    """`policy`'s model can be trained (config and tokenizer only, no weights); a warning in
    the log when its trainer's declared memory is below what the model needs (`memory`)."""
    from polyrl.workers.models import loading as model  # transformers: not for the workflow runner
    from polyrl.workers.models import memory

    try:
        model.check_source(policy.model, cache_dir=cache_dir)
        config = model.source_config(policy.model, cache_dir=cache_dir or Path())
    except ValueError as err:
        raise ConfigError(f"policy {policy.name!r}: {err}") from None
    if config is None:
        return
    meta: Any = memory.meta_model(config)
    n_parameters, trainable = sum(p.numel() for p in meta.parameters()), None
    if policy.trainer.lora is not None:  # the adapters' layers exist: tried on the shapes
        from polyrl.workers.models import lora

        try:
            trainable = sum(p.numel() for p in lora.trainable(lora.wrap(meta, policy.trainer.lora)))
        except ConfigError as err:
            raise ConfigError(f"policy {policy.name!r}: {err}") from None
    largest = max(memory.layer_parameters(meta), default=0)
    if short := memory.shortfall(policy, n_parameters, trainable, largest_layer=largest):
        log.warning("%s", short)


def job(spec: RLJobSpec) -> None:
    """Everything above, for the whole job."""
    workflow_and_task(spec)
    for policy in spec.policies:
        policy_model(policy)


# Model paths that name no local directory to look into before the trainer resolves them.
_BUILT_OR_REMOTE = ("tiny-llama://", "tiny-bpe://", "hf://", "s3://", "gs://", "http")


def model_files(policy: PolicySpec) -> None:
    """What can be said of `policy`'s model without importing transformers: a local (or
    `pvc://`) path exists, is a directory and holds a `config.json` naming a model type.
    The trainer checks the rest (`policy_model`) once it has imported transformers."""
    path = policy.model.path
    if path.startswith(_BUILT_OR_REMOTE):
        return
    try:
        directory = Path(sources.resolve(path))
    except ValueError as err:
        raise ConfigError(f"policy {policy.name!r}: {err}") from None
    where = f"policy {policy.name!r}: model path {path!r}"
    if not directory.exists():
        raise ConfigError(f"{where} does not exist")
    if path.lower().endswith(".gguf"):
        _gguf_file(directory, where)
        return
    if not directory.is_dir():
        raise ConfigError(f"{where} is not a directory")
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{where} holds no model config (config.json): {err}") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise ConfigError(f"{where}: its config.json names no model_type")


def _gguf_file(file: Path, where: str) -> None:
    """A `.gguf` path is one file beginning with the GGUF magic (the hash and architecture
    are checked by the trainer, which has `gguf` installed)."""
    if not file.is_file():
        raise ConfigError(f"{where} is not a file (a .gguf path names one file)")
    with open(file, "rb") as f:
        head = f.read(4)
    if head != b"GGUF":
        raise ConfigError(f"{where} is not a GGUF file (it starts with {head!r})")


def trainer_then(argv: list[str]) -> int:
    """`polyrl worker trainer <launcher> ...`: check the trainer's input (its policy, the
    job's workflow and task, its model's files), then become `<launcher>` (torchrun), or
    exit 2 saying what is wrong, as every worker does."""
    from polyrl.workers.runtime import worker as runtime  # nats and pydantic: no torch

    if not argv:
        print("usage: polyrl worker trainer <launcher> [args...]", file=sys.stderr)
        return 2
    try:
        config, _ = runtime.load_config()
        policy = config.spec.policy(config.policy or "")
        if policy is None:
            raise ConfigError(f"policy {config.policy!r} is not in the job's spec")
        roles(config.spec)
        model_files(policy)
    except ConfigError as err:
        return runtime.fail("polyrl trainer", err)
    os.execvp(argv[0], argv)
