"""A policy trained by two trainer pods on the test cluster: torchrun's c10d rendezvous over
the network, data-parallel steps with gloo, and both ranks at the same step with the same
weights at the end.

The operator renders the production path: the rendezvous endpoint is trainer pod 0 by name
behind the group's headless Service (`<group>-trainer-0.<group>-trainer:29400`). Each pod has
an address of its own, and the node agent stands in for the cluster's DNS by naming the
Service's pods in their /etc/hosts. Rank 0 alone talks to NATS; rank 1 trains on its share of
every batch, and gradients are averaged between the pods.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator_stack import PodLogs, explained, wait_no_pod_processes

from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 6
GROUP = "gang-solver"
JOB = {
    "apiVersion": "polyrl.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "gang"},
    "spec": {
        "policies": [
            {
                "name": "solver",
                "model": {"path": "tiny-bpe://qwen3/e2e-gang", "promptFormat": "chat"},
                "trainer": {
                    "replicas": 2,
                    "nprocPerNode": 1,
                    "batchSize": 16,
                    "microBatchSize": 8,
                    "checkpoint": {"size": "1Gi"},
                },
                "rollout": {"replicas": 1, "maxBatchSize": 16},
            }
        ],
        "workflow": {"name": "single", "episodesInFlight": 1, "task": {"params": {"digits": 1}}},
        "algorithm": {"groupSize": 4, "maxNewTokens": 3},
        "stop": {"steps": STEPS},
    },
}
AGREE = re.compile(r"(\d+) ranks agree: step (\d+), weights ([0-9a-f]{16})")


def agreements(logs: Path) -> dict[str, tuple[int, int, str]]:
    """Each trainer pod's 'N ranks agree: step S, weights H' line: pod log -> (N, S, H)."""
    found = {}
    for log in logs.glob(f"{GROUP}-trainer-*-trainer.log"):
        for match in AGREE.finditer(log.read_text(errors="replace")):
            found[log.name] = (int(match[1]), int(match[2]), match[3])
    return found


def test_two_trainer_pods_rendezvous_train_data_parallel_and_end_in_step(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    ns = real_ns
    logs = PodLogs(cluster, ns, tmp_path / "pod-logs")
    with explained(kubectl, operator, logs):
        started = time.monotonic()
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(JOB))
        pods = wait_until(
            "both trainer pods running, each at an address of its own",
            lambda: trainer_pods(kubectl, ns),
            timeout=120,
        )
        assert len({p["status"]["podIP"] for p in pods}) == 2

        def ended() -> dict[str, Any] | None:
            logs.collect()
            job = kubectl.json("get", "rlj", "gang", "-n", ns)
            return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        job = wait_until("the job to end", ended, timeout=300, interval=1)
        print(f"ended {job['status']['phase']} in {time.monotonic() - started:.0f}s")
        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert job["status"]["policies"][0]["step"] == STEPS
        wait_no_pod_processes(logs)
        logs.collect()  # whole logs: every process has ended; a deleted pod's logs are kept
        # The ranks compared step and weights when training ended (they stop the trainer if
        # they differ): both at the last step, bit-identical, so every step was taken together.
        said = agreements(tmp_path / "pod-logs")
        assert said, "no trainer pod's log says the ranks agree"
        assert set(said.values()) == {(2, STEPS, next(iter(said.values()))[2])}, said
        kubectl("delete", "rlj", "gang", "-n", ns, "--timeout=60s")


def trainer_pods(kubectl: Kubectl, ns: str) -> list[dict[str, Any]] | None:
    selector = f"polyrl.dev/policy-group={GROUP},polyrl.dev/role=trainer"
    pods: list[dict[str, Any]] = kubectl.json("get", "pods", "-n", ns, "-l", selector)["items"]
    up = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
    return up if len(up) == 2 else None
