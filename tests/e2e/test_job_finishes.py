"""A short job with the real workers, on the test cluster, from apply to a model on disk.

The policy is a tiny Qwen3 with a byte-level BPE tokenizer and a chat template
(`tiny-bpe://`), so a real architecture's token-in/token-out path runs under the operator.

The trainer pod is deleted mid-run (as a node loss or an eviction would): its replacement
mounts the same checkpoint claim and resumes from the last checkpoint in a new epoch,
numbering versions after the last one announced. The job then finishes: Succeeded with a
Complete condition, its final step and version in status, every pod and process gone, and
the model in the claim where `status.policies[].output` says, which `polyrl export` turns
into a Hugging Face directory, as it does the weights the job left in NATS.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from tests.operator_stack import PodLogs, explained, wait_no_pod_processes

from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Killed at 15 of 60: on a quiet machine this tiny policy trains about 10 steps a second, so
# the trainer must still have seconds of steps left when the test sees step 15 and deletes it.
STEPS, KILL_AT, CHECKPOINT_EVERY = 60, 15, 10
JOB = {
    "apiVersion": "polyrl.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "short"},
    "spec": {
        "policies": [
            {
                "name": "solver",
                # A Qwen3 with a BPE tokenizer, its prompts through its chat template.
                "model": {"path": "tiny-bpe://qwen3/e2e-short", "promptFormat": "chat"},
                "trainer": {
                    "batchSize": 16,
                    "microBatchSize": 16,
                    "checkpointEvery": CHECKPOINT_EVERY,
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


async def announcements(url: str, names: JobNames) -> list[tuple[int, int]]:
    """(epoch, version) of every weight announcement the stream still holds, in order."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        found: list[tuple[int, int]] = []
        sub = await js.subscribe(names.weights_subject("solver"), ordered_consumer=True)
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except nats.errors.TimeoutError:
                return found
            doc = json.loads(msg.data)
            found.append((doc["epoch"], doc["version"]))
    finally:
        await nc.close()


def export(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "polyrl.cli", "export", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def status_of(kubectl: Kubectl, ns: str, kind: str, name: str) -> dict[str, Any]:
    """The object's status; empty while it does not exist."""
    got = kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    found: dict[str, Any] = json.loads(got.stdout).get("status", {}) if got.returncode == 0 else {}
    return found


def check_model_left(
    kubectl: Kubectl, job: dict[str, Any], nats_job: str, version: int, tmp_path: Path
) -> None:
    """The model is in the claim where status says, and in NATS at its last `version`; both
    export to a Hugging Face directory."""
    ns, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
    output = job["status"]["policies"][0]["output"]
    assert output == f"pvc://short-solver-checkpoints/{uid}/{ns}/short/solver/checkpoint"
    claim = kubectl.json("get", "pvc", "short-solver-checkpoints", "-n", ns)
    pv = kubectl.json("get", "pv", claim["spec"]["volumeName"])
    directory = Path(pv["spec"]["hostPath"]["path"]) / output.split("/", 3)[3]
    saved = json.loads((directory / "trainer.json").read_text())
    assert (saved["step"], saved["epoch"]) == (STEPS, 1)
    export(str(directory), str(tmp_path / "from-claim"))
    assert (tmp_path / "from-claim" / "model.safetensors").is_file()
    out = export(nats_job, str(tmp_path / "from-nats"), "--policy", "solver").stdout
    assert f"version {version}" in out
    assert (tmp_path / "from-nats" / "config.json").is_file()


def test_a_short_job_survives_a_lost_trainer_pod_finishes_and_leaves_its_model(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    ns = real_ns
    logs = PodLogs(cluster, ns, tmp_path / "pod-logs")
    group = "short-solver"

    def status(kind: str, name: str) -> dict[str, Any]:
        return status_of(kubectl, ns, kind, name)

    with explained(kubectl, operator, logs):
        started = time.monotonic()
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(JOB))

        def reached() -> bool:
            logs.collect()
            return int(status("pg", group).get("step", 0)) >= KILL_AT

        wait_until(f"the trainer at step {KILL_AT}", reached, timeout=240, interval=0.25)
        before = status("pg", group)["step"]
        names = JobNames(namespace=ns, job="short")
        kubectl("delete", "pod", f"{group}-trainer-0", "-n", ns, "--wait=true")
        first_epoch = asyncio.run(announcements(nats_server.url, names))
        print(f"trainer pod deleted at step {before}, {time.monotonic() - started:.0f}s in")
        steps_after: list[int] = []

        def ended() -> dict[str, Any] | None:
            logs.collect()
            pod = kubectl("get", "pod", f"{group}-trainer-0", "-n", ns, "-o", "json", check=False)
            if pod.returncode == 0 and json.loads(pod.stdout)["status"].get("phase") == "Running":
                steps_after.append(status("pg", group).get("step", 0))
            job = kubectl.json("get", "rlj", "short", "-n", ns)
            return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        job = wait_until("the job to end", ended, timeout=300, interval=1)
        print(f"ended {job['status']['phase']} in {time.monotonic() - started:.0f}s")

        # The replacement resumed: it never reported a step below the last checkpoint,
        # and its versions carry on in a new epoch.
        resumed_from = (before // CHECKPOINT_EVERY) * CHECKPOINT_EVERY
        assert steps_after, "the replacement trainer was never seen running"
        assert min(steps_after) >= resumed_from, steps_after
        announced = asyncio.run(announcements(nats_server.url, names))  # the last 64
        assert {e for e, _ in first_epoch} == {0}
        versions = [v for e, v in announced if e == 1]
        assert versions, announced
        assert versions == sorted(versions)  # a keyframe may follow its version's delta
        assert min(versions) > max(v for _, v in first_epoch), "a version number was reused"

        # Finished: Succeeded, Complete, the final figures, nothing left running.
        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert condition(job, "Complete") == "True"
        (policy,) = job["status"]["policies"]
        assert policy["step"] == STEPS
        assert policy["completed"] is True
        assert policy["weightVersion"] == max(versions)
        pg = kubectl.json("get", "pg", group, "-n", ns)
        assert pg["status"]["step"] == STEPS
        trainer = next(c for c in pg["status"]["conditions"] if c["type"] == "TrainerHealthy")
        assert trainer["reason"] == "Completed"
        wait_until(
            "every pod of the job gone",
            lambda: (
                not kubectl.json("get", "pods", "-n", ns, "-l", "polyrl.dev/job=short")["items"]
            ),
            timeout=60,
        )
        wait_no_pod_processes(logs)

        check_model_left(kubectl, job, f"{nats_server.url}/{ns}/short", max(versions), tmp_path)

        kubectl("delete", "rlj", "short", "-n", ns, "--timeout=60s")
        kubectl("get", "pvc", "short-solver-checkpoints", "-n", ns)  # Retain: the model stays
