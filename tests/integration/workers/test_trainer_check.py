"""`polyrl worker trainer <launcher> ...`, a trainer pod's command: it checks the job's input
without importing torch, exits 2 saying what is wrong, or becomes the launcher.

A trainer pod used to learn of a bad task or model path only after torchrun and its ranks
had imported torch, minutes on a busy node; these checks take a second or two."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from polyrl.api.launch import CONFIG_ENV, POD_NAME_ENV, TERMINATION_LOG_ENV, Role, WorkerConfig
from polyrl.api.resources import RLJobSpec

# Stands in for torchrun: prints its arguments and exits.
LAUNCHER = [
    sys.executable,
    "-c",
    "import sys; print('launched', sys.argv[1:])",
    "--nproc-per-node=1",
]


def spec(**changes: Any) -> RLJobSpec:
    doc: dict[str, Any] = {
        "policies": [{"name": "solver", "model": {"path": "tiny-llama://s"}}],
        "workflow": {"name": "solver-verifier", "task": {"name": "arithmetic"}},
    }
    doc["workflow"] |= changes.pop("workflow", {})
    if "model" in changes:
        doc["policies"][0]["model"] = {"path": changes.pop("model")}
    doc["policies"].append({"name": "verifier", "model": {"path": "tiny-llama://v"}})
    return RLJobSpec.model_validate(doc)


def check(job: RLJobSpec, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = WorkerConfig(
        namespace="t", job="check", role=Role.TRAINER, policy="solver",
        nats_url="nats://127.0.0.1:1", spec=job,
    )  # fmt: skip
    # The check imports what it needs; a wrapper reports whether torch came along.
    probe = (
        "import sys, runpy; sys.argv = ['polyrl', *sys.argv[1:]]\n"
        "import atexit; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
        "from polyrl import cli; code = cli.main(sys.argv[1:]); sys.exit(code)\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        CONFIG_ENV: config.to_env(),
        POD_NAME_ENV: "check-solver-trainer-0",
        TERMINATION_LOG_ENV: str(tmp_path / "termination-log"),
    }
    return subprocess.run(
        [sys.executable, "-c", probe, "worker", "trainer", *LAUNCHER],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("changes", "cause"),
    [
        ({"workflow": {"task": {"name": "nosuchtask"}}}, "unknown task 'nosuchtask'"),
        ({"workflow": {"name": "nosuchmodule:fn"}}, "No module named 'nosuchmodule'"),
        ({"model": "/does/not/exist"}, "model path '/does/not/exist' does not exist"),
    ],
)
def test_a_trainer_pod_refuses_bad_input_without_importing_torch(
    changes: dict[str, Any], cause: str, tmp_path: Path
) -> None:
    proc = check(spec(**changes), tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert cause in proc.stderr
    said = (tmp_path / "termination-log").read_text()
    assert said.startswith("invalid input: ")  # what the operator quotes
    assert cause in said
    assert "torch imported: False" in proc.stdout
    assert "launched" not in proc.stdout


def test_a_model_directory_without_a_model_config_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 8}))
    proc = check(spec(model=str(model)), tmp_path)
    assert proc.returncode == 2
    assert "config.json names no model_type" in proc.stderr


def test_good_input_becomes_the_launcher_with_its_arguments(tmp_path: Path) -> None:
    proc = check(spec(), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "launched ['--nproc-per-node=1']" in proc.stdout
    assert "torch imported" not in proc.stdout  # exec'd: the checker's process is gone
