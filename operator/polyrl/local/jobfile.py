"""Reading a job file for `polyrl run`: the same models as the API server, readable errors."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from polyrl.api.resources import RLJob

LOCAL_NAMESPACE = "local"


class JobFileError(ValueError):
    """The job file cannot be run; the message names the file and the field."""


def load(path: Path) -> RLJob:
    if not path.is_file():
        raise JobFileError(f"{path}: no such job file")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise JobFileError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "RLJob":
        raise JobFileError(f"{path}: expected a manifest of kind RLJob")
    doc.setdefault("metadata", {})["namespace"] = LOCAL_NAMESPACE
    doc.pop("status", None)
    try:
        return RLJob.model_validate(doc)
    except ValidationError as err:
        raise JobFileError(f"{path}: invalid RLJob:\n{_explain(err)}") from None


def _explain(err: ValidationError) -> str:
    lines = []
    for problem in err.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        lines.append(f"  {where}: {problem['msg']}")
    return "\n".join(lines)


def preflight(job: RLJob, *, code_dir: Path | None = None) -> None:
    """Check, before any process starts, what the workers would check at their start (the
    workflow and task resolve, every model path is a causal LM), and say what is wrong.
    `code_dir` is searched first for a `module:function` workflow, as the workers will."""
    from polyrl.workers import preflight as checks
    from polyrl.workers.errors import ConfigError

    if code_dir is not None and str(code_dir) not in sys.path:
        sys.path.insert(0, str(code_dir))
    try:
        checks.job(job.spec)
    except ConfigError as err:
        raise JobFileError(f"invalid input: {err}") from None
