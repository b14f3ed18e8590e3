"""Fault injection on the test cluster, checked by a ledger of trajectory ids.

Real workers in exec-mode pods, the real operator and nats-server. Each case runs a short
job with `trainer.ledger` on, injects its fault, lets the job finish, then reconciles every
id the trajectory stream holds (what the workflow runner published) with the ids the
trainer's ledger says it trained or dropped (`polyrl.testing.ledger`): no id trained twice
except after a resume rolled its step back, none trained that was never published, and
what a resume re-trained bounded by checkpointEvery x batchSize per resume. Each case
prints its ledger; the module prints the table of all cases it ran.

The rollout kill runs in `make test`; the trainer kills and the runner kill are marked
`chaos` (`make test-chaos`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from tests.operator_stack import OperatorProcess, PodLogs, explained, pod_processes

from polyrl.api.naming import JobNames
from polyrl.bench.dataplane import stream_ids
from polyrl.local.natsserver import NatsServer
from polyrl.testing import ledger
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BATCH = 16
TABLE: dict[str, ledger.Account] = {}


@pytest.fixture(scope="module", autouse=True)
def suite_table() -> Iterator[None]:
    yield
    if TABLE:
        print("\nfault-injection suite, trajectory ledger per case:\n" + ledger.table(TABLE))


def job(name: str, *, steps: int, checkpoint_every: int = 50) -> dict[str, Any]:
    return {
        "apiVersion": "polyrl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": f"tiny-llama://chaos-{name}"},
                    "trainer": {
                        "batchSize": BATCH,
                        "microBatchSize": BATCH,
                        "checkpointEvery": checkpoint_every,
                        "checkpoint": {"size": "1Gi"},
                        "ledger": True,
                        "restartLimit": 10,
                    },
                    "rollout": {"replicas": 2, "maxBatchSize": 16},
                }
            ],
            "workflow": {
                "name": "single",
                "episodesInFlight": 4,
                "task": {"params": {"digits": 1}},
            },
            "algorithm": {"groupSize": 4, "maxNewTokens": 3},
            "stop": {"steps": steps},
        },
    }


class Case:
    """One job on the cluster: its status, its pods' processes, and its ledger at the end."""

    def __init__(
        self, kubectl: Kubectl, ns: str, name: str, logs: PodLogs, nats_server: NatsServer
    ) -> None:
        self.kubectl, self.ns, self.name, self.logs = kubectl, ns, name, logs
        self.nats_url = nats_server.url

    def status(self, kind: str, name: str) -> dict[str, Any]:
        got = self.kubectl("get", kind, name, "-n", self.ns, "-o", "json", check=False)
        return json.loads(got.stdout).get("status", {}) if got.returncode == 0 else {}

    def step(self) -> int:
        self.logs.collect()
        return int(self.status("pg", f"{self.name}-solver").get("step", 0))

    def wait_step(self, step: int) -> None:
        wait_for(
            f"{self.name} at step {step}", lambda: self.step() >= step, timeout=240, interval=1
        )

    def processes_of(self, pod: str) -> list[int]:
        found = []
        for pid in pod_processes(self.logs):
            with contextlib.suppress(OSError):
                if f"POLYRL_POD_NAME={pod}\0".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    found.append(pid)
        return found

    def kill(self, pod: str) -> int:
        """SIGKILL the pod's processes (by PID, found by the sandbox the node agent made),
        once it has some: a pod being replaced has none for a while."""
        mine = wait_for(f"a process of pod {pod}", lambda: self.processes_of(pod), timeout=120)
        for pid in mine:
            os.kill(pid, signal.SIGKILL)
        return len(mine)

    def finish(self) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            self.logs.collect()
            found = self.kubectl.json("get", "rlj", self.name, "-n", self.ns)
            return (
                found if found.get("status", {}).get("phase") in ("Succeeded", "Failed") else None
            )

        done: dict[str, Any] = wait_for(f"{self.name} to end", ended, timeout=300, interval=1)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        return done

    async def runner_beat(self, names: JobNames) -> dict[str, Any]:
        """The workflow runner's last heartbeat (kept a minute after it stopped)."""
        nc = await nats.connect(self.nats_url)
        try:
            kv = await nc.jetstream().key_value(names.heartbeats_bucket)
            entry = await kv.get(
                JobNames.heartbeat_key(None, "workflow", f"{self.name}-workflow-0")
            )
            beat: dict[str, Any] = json.loads(entry.value or b"{}")
            return beat
        finally:
            await nc.close()

    def entries(self) -> list[ledger.Entry]:
        """The trainer's ledger so far, read from its checkpoint claim's volume."""
        uid = self.kubectl.json("get", "rlj", self.name, "-n", self.ns)["metadata"]["uid"]
        got = self.kubectl(
            "get",
            "pvc",
            f"{self.name}-solver-checkpoints",
            "-n",
            self.ns,
            "-o",
            "json",
            check=False,
        )
        claim = json.loads(got.stdout) if got.returncode == 0 else {}
        if not claim.get("spec", {}).get("volumeName"):
            return []
        pv = self.kubectl.json("get", "pv", claim["spec"]["volumeName"])
        workdir = Path(pv["spec"]["hostPath"]["path"]) / uid / self.ns / self.name / "solver"
        path = workdir / "ledger.jsonl"
        return ledger.read(path) if path.is_file() else []

    def ledger(self) -> ledger.Account:
        entries = self.entries()
        names = JobNames(namespace=self.ns, job=self.name)
        published = asyncio.run(self._published(names))
        return ledger.account(published, entries)

    async def _published(self, names: JobNames) -> list[str]:
        nc = await nats.connect(self.nats_url)
        try:
            return await stream_ids(nc.jetstream(), names.trajectories_subject("solver"))
        finally:
            await nc.close()


def run_case(
    case_name: str,
    kubectl: Kubectl,
    ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
    doc: dict[str, Any],
    inject: Callable[[Case], None],
) -> ledger.Account:
    name = doc["metadata"]["name"]
    logs = PodLogs(cluster, ns, tmp_path / "pod-logs")
    case = Case(kubectl, ns, name, logs, nats_server)
    case.nats_url = doc["spec"].get("nats", {}).get("url") or nats_server.url
    with explained(kubectl, operator, logs):
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
        started = time.monotonic()
        inject(case)
        case.finish()
        acc = case.ledger()
        runner = asyncio.run(case.runner_beat(JobNames(namespace=ns, job=name)))
    print(f"{case_name}: {time.monotonic() - started:.0f}s, ledger {json.dumps(acc.row())}")
    TABLE[case_name] = acc
    assert acc.faults == 0, (acc.trained_twice[:5], acc.never_published[:5])
    assert acc.accounted == acc.published
    assert runner.get("failed_episodes", 0) == 0, runner  # no episode failed
    return acc


def test_a_rollout_pod_killed_mid_generation_loses_no_episode_and_no_sample(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    def inject(case: Case) -> None:
        case.wait_step(3)
        case.kill(f"{case.name}-solver-rollout-0")

    acc = run_case(
        "rollout SIGKILL", kubectl, real_ns, operator, cluster, nats_server, tmp_path,
        job("rkill", steps=8), inject,
    )  # fmt: skip
    assert acc.resumes == 0
    assert acc.trained_once >= 8 * BATCH


@pytest.mark.chaos
def test_a_trainer_killed_mid_step_three_times_resumes_each_time_and_loses_nothing(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    kills = 3

    def inject(case: Case) -> None:
        for epoch in range(kills):  # each trainer trains two steps of its epoch, then dies
            wait_for(
                f"epoch {epoch} to train two steps",
                lambda: sum(e.epoch == epoch for e in case.entries()) >= 2,  # noqa: B023
                timeout=240,
                interval=0.5,
            )
            case.kill(f"{case.name}-solver-trainer-0")

    acc = run_case(
        "trainer SIGKILL x3", kubectl, real_ns, operator, cluster, nats_server, tmp_path,
        job("tkill", steps=14), inject,
    )  # fmt: skip
    assert acc.resumes == kills
    # what resumes re-trained is bounded by checkpointEvery x batchSize per resume (default 50)
    assert acc.retrained_after_resume + acc.only_rolled_back <= kills * 50 * BATCH


@pytest.mark.chaos
def test_a_workflow_runner_killed_mid_episode_is_replaced_and_the_job_goes_on(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    def inject(case: Case) -> None:
        case.wait_step(3)
        case.kill(f"{case.name}-workflow-0")

    acc = run_case(
        "runner SIGKILL", kubectl, real_ns, operator, cluster, nats_server, tmp_path,
        job("wkill", steps=10), inject,
    )  # fmt: skip
    assert acc.trained_once >= 10 * BATCH


@pytest.mark.chaos
def test_nats_stopped_and_restarted_mid_run_every_worker_reconnects_and_the_job_finishes(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    with NatsServer(tmp_path / "own-nats") as own:  # file storage, kept across the restart
        doc = job("nrestart", steps=10)
        doc["spec"]["nats"] = {"url": own.url}

        def inject(case: Case) -> None:
            case.wait_step(3)
            own.restart(down_seconds=5)

        acc = run_case(
            "nats-server restart", kubectl, real_ns, operator, cluster, nats_server, tmp_path,
            doc, inject,
        )  # fmt: skip
        kubectl("delete", "rlj", "nrestart", "-n", real_ns)  # while its NATS still runs
    assert acc.trained_once >= 10 * BATCH
