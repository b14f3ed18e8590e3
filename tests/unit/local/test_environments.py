"""`polyrl run` starts vLLM rollout workers in the vLLM environment, and says how to get one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from polyrl.api import plan
from polyrl.api.launch import Role
from polyrl.api.resources import RLJob
from polyrl.local import environments, jobfile

REPO = Path(__file__).resolve().parents[3]


def job(engine: str) -> RLJob:
    loaded = jobfile.load(REPO / "examples" / "vllm-cpu.yaml")
    loaded.spec.policies[0].rollout.engine = engine  # type: ignore[assignment]
    return loaded


def fake_env(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "polyrl").write_text("#!/bin/sh\n")
    return root


def test_a_job_without_vllm_needs_no_vllm_environment(tmp_path: Path) -> None:
    assert environments.vllm_env(job("torch"), tmp_path / "nowhere") is None


def test_a_missing_vllm_environment_is_a_clear_error_naming_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(environments.ENV_VAR, raising=False)
    with pytest.raises(jobfile.JobFileError) as caught:
        environments.vllm_env(job("vllm"), tmp_path / "nowhere")
    message = str(caught.value)
    assert "policy solver has rollout.engine: vllm" in message
    assert str(tmp_path / "nowhere") in message
    assert "make install-vllm" in message


def test_the_environment_is_found_from_the_option_then_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named, from_var = fake_env(tmp_path / "named"), fake_env(tmp_path / "var")
    monkeypatch.setenv(environments.ENV_VAR, str(from_var))
    assert environments.vllm_env(job("vllm"), named) == named.resolve()
    assert environments.vllm_env(job("vllm")) == from_var.resolve()


def test_only_vllm_rollout_workers_run_with_the_vllm_environment_first_on_path(
    tmp_path: Path,
) -> None:
    env = fake_env(tmp_path / "vllm")
    vllm_job = job("vllm")
    launches = plan.plan(vllm_job, nats_url="nats://127.0.0.1:4222").launches
    paths = {launch.role: environments.path_for(launch, vllm_job, env) for launch in launches}
    assert paths[Role.ROLLOUT].split(os.pathsep)[0] == str(env / "bin")
    main_bin = str(Path(sys.executable).parent)
    assert paths[Role.TRAINER].split(os.pathsep)[0] == main_bin
    assert paths[Role.WORKFLOW].split(os.pathsep)[0] == main_bin
    torch_job = job("torch")
    [rollout] = [
        launch
        for launch in plan.plan(torch_job, nats_url="nats://127.0.0.1:4222").launches
        if launch.role == Role.ROLLOUT
    ]
    assert environments.path_for(rollout, torch_job, env).split(os.pathsep)[0] == main_bin
