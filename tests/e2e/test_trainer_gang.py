"""A policy trained by two trainer pods on the test cluster: torchrun's c10d rendezvous over
the network, data-parallel (or, with `strategy: fsdp2`, sharded) steps with gloo, and both
ranks at the same step with the same weights at the end. The sharded gang loses a pod
mid-run: the operator restarts the gang, which resumes from its distributed checkpoint.

The operator renders the production path: the rendezvous endpoint is trainer pod 0 by name
behind the group's headless Service (`<group>-trainer-0.<group>-trainer:29400`). Each pod has
an address of its own, and the node agent stands in for the cluster's DNS by naming the
Service's pods in their /etc/hosts. Rank 0 alone talks to NATS; rank 1 trains on its share of
every batch, and gradients are averaged between the pods.
"""

from __future__ import annotations

import copy
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
# The sharded gang is killed mid-run: enough steps that a quick machine cannot finish them
# between the kill's trigger and its landing.
SHARDED_STEPS = 20
NAMES = {"ddp": "gang", "fsdp2": "gang-sharded"}  # each its own claim and pods
JOB: dict[str, Any] = {
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


def agreements(logs: Path, group: str) -> dict[str, tuple[int, int, str]]:
    """Each trainer pod's 'N ranks agree: step S, weights H' line: pod log -> (N, S, H)."""
    found = {}
    for log in logs.glob(f"{group}-trainer-*-trainer.log"):
        for match in AGREE.finditer(log.read_text(errors="replace")):
            found[log.name] = (int(match[1]), int(match[2]), match[3])
    return found


KILL_AT = 3  # the sharded gang loses a pod once past this step (a checkpoint every 2)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_trainer_pods_rendezvous_train_data_parallel_and_end_in_step(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    tmp_path: Path,
    strategy: str,
) -> None:
    """ddp: gradients averaged between the pods; fsdp2: the model sharded over them, each
    pod writing its shards of every checkpoint to the claim they both mount; a pod killed
    mid-run restarts the gang from the checkpoint, on shards loaded by both pods."""
    ns = real_ns
    logs = PodLogs(cluster, ns, tmp_path / "pod-logs")
    job, name = copy.deepcopy(JOB), NAMES[strategy]
    job["metadata"]["name"] = name
    trainer = job["spec"]["policies"][0]["trainer"]
    trainer["strategy"] = strategy
    sharded = strategy == "fsdp2"
    if sharded:
        trainer["checkpointEvery"] = 2
    steps = SHARDED_STEPS if sharded else STEPS
    job["spec"]["stop"]["steps"] = steps
    group = f"{name}-solver"
    with explained(kubectl, operator, logs):
        started = time.monotonic()
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))
        pods = wait_until(
            "both trainer pods running, each at an address of its own",
            lambda: trainer_pods(kubectl, ns, group),
            timeout=120,
        )
        assert len({p["status"]["podIP"] for p in pods}) == 2
        if sharded:
            killed = kill_mid_run(kubectl, ns, group, steps)
            print(f"trainer pod 1 deleted at step {killed}")

        def ended() -> dict[str, Any] | None:
            logs.collect()
            got = kubectl.json("get", "rlj", name, "-n", ns)
            return got if got.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        done = wait_until("the job to end", ended, timeout=300, interval=1)
        print(f"ended {done['status']['phase']} in {time.monotonic() - started:.0f}s")
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert done["status"]["policies"][0]["step"] == steps
        wait_no_pod_processes(logs)
        logs.collect()  # whole logs: every process has ended; a deleted pod's logs are kept
        # The ranks compared step and weights when training ended (they stop the trainer if
        # they differ): both at the last step, bit-identical, so every step was taken together.
        said = agreements(tmp_path / "pod-logs", group)
        assert said, "no trainer pod's log says the ranks agree"
        last = {log: got for log, got in said.items() if got[1] == steps}
        assert len(last) == 2, said  # both pods of the gang that finished
        assert len(set(last.values())) == 1, said
        assert next(iter(last.values()))[0] == 2, said
        if not sharded:
            assert last == said, said
        else:  # the killed gang stopped where it was (together, saving), the next resumed
            assert all(got[1] < steps for log, got in said.items() if log not in last), said
            said = last
            restarts = kubectl.json("get", "pg", group, "-n", ns)["status"]["trainerRestarts"]
            assert restarts == 1, restarts
            for log in said:
                text = (tmp_path / "pod-logs" / log).read_text(errors="replace")
                assert "sharded checkpoint loaded on 2 ranks" in text, log
                assert f"sharded checkpoint at step {steps} saved" in text, log
        kubectl("delete", "rlj", name, "-n", ns, "--timeout=60s")


def kill_mid_run(kubectl: Kubectl, ns: str, group: str, steps: int) -> int:
    """Kill trainer pod 1 (deleted with no grace, which kubectl makes 1 s: SIGKILL follows
    at once, as a crash or a lost node ends it) once the gang
    is past `KILL_AT` steps; the step it was at. A graceful deletion would not do: rank 1
    waits for rank 0's word to stop (so that a gang's last save is never cut short), and a
    quick gang can finish its steps within the grace period."""

    def step() -> int | None:
        got = kubectl.json("get", "pg", group, "-n", ns).get("status", {}).get("step", 0)
        return int(got) if int(got) >= KILL_AT else None

    at = wait_until(f"the gang past step {KILL_AT}", step, timeout=180, interval=0.25)
    assert at < steps, f"the job reached step {at} before the kill"
    kubectl("delete", "pod", f"{group}-trainer-1", "-n", ns, "--wait=false", "--grace-period=0")
    return at


def trainer_pods(kubectl: Kubectl, ns: str, group: str) -> list[dict[str, Any]] | None:
    selector = f"polyrl.dev/policy-group={group},polyrl.dev/role=trainer"
    pods: list[dict[str, Any]] = kubectl.json("get", "pods", "-n", ns, "-l", selector)["items"]
    up = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
    return up if len(up) == 2 else None
