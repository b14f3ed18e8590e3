"""vLLM on the CPU serving a real job (examples/vllm-cpu.yaml): under `polyrl run`, as its
header says to run it, and under the operator on the test cluster.

The rollout worker runs in the vLLM environment (`make install-vllm`: vllm-cpu with its
torch 2.13), everything else in the main one: `polyrl run` picks the interpreter by the
policy's engine, the test cluster's node agent by the pod's image (the vLLM worker image maps
to `.venv-vllm`; see `--image-env`). Each run must sync at least `VERSIONS` weight versions
into the engine through vLLM's in-place reload, with every episode answered.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests import documented
from tests.conftest import VLLM_ENV
from tests.operator_stack import REPO, PodLogs, explained, wait_no_pod_processes

from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = "examples/vllm-cpu.yaml"
STEPS = 12  # the example's trainer.steps
VERSIONS = 5


@pytest.fixture(autouse=True)
def vllm_environment() -> None:
    assert (VLLM_ENV / "bin" / "polyrl").is_file(), "no .venv-vllm: run `make install-vllm`"


def served_versions(rollout_log: str) -> list[int]:
    return [int(v) for v in re.findall(r"serving weight version (\d+)", rollout_log)]


def check_rollout_log(text: str) -> None:
    """The worker ran vLLM from the vLLM environment and synced the trainer's versions."""
    engine = re.search(r"vllm engine on (\w+) \(python environment (\S+)\)", text)
    assert engine is not None, text[-3000:]
    assert engine.group(1) == "cpu"
    assert Path(engine.group(2)).resolve() == VLLM_ENV.resolve()
    versions = served_versions(text)
    assert len(versions) >= VERSIONS, versions
    assert versions == sorted(versions), versions


@pytest.mark.vllm_slow  # 80 s on 2 cores: `make test-vllm`, not `make test`
def test_polyrl_run_serves_a_job_with_vllm_rollouts_in_their_own_environment(
    tmp_path: Path,
) -> None:
    proc, records = documented.run_example(EXAMPLE, tmp_path)
    steps = [r["step"] for r in records if r.get("policy") == "solver" and "step" in r]
    assert max(steps) == STEPS
    logs = tmp_path / "run" / "logs"
    check_rollout_log(next(logs.glob("*-rollout-0.log")).read_text())
    runner = next(logs.glob("*-workflow-0.log")).read_text()
    assert re.search(r"\d+ episodes done, 0 failed, 0 dropped", runner), runner[-2000:]
    assert "solver  held-out" in proc.stderr


@pytest.mark.vllm_slow  # 3 minutes on 2 cores: `make test-vllm`, not `make test`
def test_the_operator_runs_vllm_rollout_pods_from_the_vllm_image(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    doc: dict[str, Any] = yaml.safe_load((REPO / EXAMPLE).read_text())
    job = doc["metadata"]["name"]
    logs = PodLogs(cluster, real_ns, tmp_path / "pod-logs")
    with explained(kubectl, operator, logs):
        kubectl("apply", "--validate=strict", "-n", real_ns, "-f", "-", input=yaml.safe_dump(doc))
        started = time.monotonic()

        def finished() -> dict[str, Any] | None:
            logs.collect()
            status = kubectl.json("get", "rlj", job, "-n", real_ns).get("status", {})
            return status if status.get("phase") in ("Succeeded", "Failed") else None

        status = wait_until("the job finished", finished, timeout=420, interval=2)
        print(f"ended {status['phase']} in {time.monotonic() - started:.0f}s")
        assert status["phase"] == "Succeeded", status
        logs.collect()
        [rollout] = logs.dest.glob(f"{job}-solver-rollout-0-*-rollout.log")
        check_rollout_log(rollout.read_text())
        kubectl("delete", "rlj", job, "-n", real_ns, "--timeout=120s")
        wait_no_pod_processes(logs)
