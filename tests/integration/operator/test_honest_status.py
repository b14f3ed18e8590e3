"""Status that tells the truth: figures only from pods that exist, a phase that stays Running
while a job scales or replaces a pod (Ready says what is degraded), restarts counted, and
the NATS a job runs on and how isolated it is, said in its conditions."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import nats

from polyrl.api import naming
from polyrl.api.messages import Heartbeat
from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.waiting import wait_until

from .conftest import OperatorProcess
from .helpers import apply, get, job_doc, live, pods, reasons, two_more_passes, wait_running

GROUP = {"apiVersion": "polyrl.dev/v1alpha1", "kind": "PolicyGroup"}


async def put_heartbeats(url: str, ns: str, job: str, versions: dict[str, int]) -> None:
    """What serving rollout workers would say: each pod's weight version."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(JobNames(namespace=ns, job=job).heartbeats_bucket)
        for pod, version in versions.items():
            beat = Heartbeat(
                pod=pod,
                role="rollout",
                policy="solver",
                state="serving",
                weight_version=version,
                at=time.time(),
            )
            key = JobNames.heartbeat_key("solver", "rollout", pod)
            await kv.put(key, beat.model_dump_json().encode())
    finally:
        await nc.close()


def status_of(kubectl: Kubectl, ns: str, kind: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get(kubectl, ns, kind, name).get("status", {})
    return found


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def wait_phase(kubectl: Kubectl, ns: str, job: str, phase: str, timeout: float = 60) -> None:
    wait_until(
        f"job {job} {phase}",
        lambda: status_of(kubectl, ns, "rlj", job).get("phase") == phase,
        timeout=timeout,
    )


def test_a_groups_weight_version_comes_only_from_rollout_pods_that_exist(
    kubectl: Kubectl, ns: str, nats_server: NatsServer
) -> None:
    # Regression: after scaling 3 -> 1, VERSION kept the lowest version of the pods scaled
    # away (the operator's mirror keeps a heartbeat after its pod is gone).
    apply(kubectl, ns, job_doc("ver", rollout={"replicas": 3, "drainTimeoutSeconds": 1}))
    rollouts = "polyrl.dev/policy-group=ver-solver,polyrl.dev/role=rollout"
    wait_running(kubectl, ns, rollouts, 3)
    versions = {"ver-solver-rollout-0": 140, "ver-solver-rollout-1": 96, "ver-solver-rollout-2": 97}
    asyncio.run(put_heartbeats(nats_server.url, ns, "ver", versions))
    wait_until(
        "the group's version: the lowest its pods serve",
        lambda: status_of(kubectl, ns, "pg", "ver-solver").get("weightVersion") == 96,
    )
    kubectl("scale", "pg", "ver-solver", "-n", ns, "--replicas=1")  # rollout-2, -1 drain away
    wait_until("two pods gone", lambda: len(live(pods(kubectl, ns, rollouts))) == 1, timeout=30)
    wait_until(
        "the version of the pod that is left",
        lambda: status_of(kubectl, ns, "pg", "ver-solver").get("weightVersion") == 140,
        timeout=30,
    )


def test_a_trainer_pod_deleted_by_hand_is_replaced_counted_and_the_job_stays_running(
    kubectl: Kubectl, ns: str, operator: OperatorProcess
) -> None:
    apply(kubectl, ns, job_doc("lost"))
    wait_phase(kubectl, ns, "lost", "Running")
    before = get(kubectl, ns, "pod", "lost-solver-trainer-0")["metadata"]["uid"]
    kubectl("delete", "pod", "lost-solver-trainer-0", "-n", ns, "--wait=false")
    phases = []

    def replaced() -> bool:
        phases.append(status_of(kubectl, ns, "rlj", "lost").get("phase"))
        group = status_of(kubectl, ns, "pg", "lost-solver")
        pod = [
            p
            for p in live(pods(kubectl, ns, "polyrl.dev/role=trainer,polyrl.dev/job=lost"))
            if p["status"].get("phase") == "Running"
        ]
        return (
            group.get("trainerRestarts") == 1 and bool(pod) and pod[0]["metadata"]["uid"] != before
        )

    wait_until("a new trainer pod, counted as a restart", replaced, timeout=60)
    assert set(phases) == {"Running"}, phases  # never back to Pending
    wait_until(
        "a TrainerRestarted event",
        lambda: "TrainerRestarted" in reasons(kubectl, ns, "lost-solver"),
    )
    two_more_passes(kubectl, operator, "policygroup")  # one replacement is one restart
    assert status_of(kubectl, ns, "pg", "lost-solver")["trainerRestarts"] == 1


def test_a_running_job_that_cannot_serve_all_it_asks_stays_running_and_says_why(
    kubectl: Kubectl, ns: str
) -> None:
    apply(kubectl, ns, job_doc("grow"))
    wait_phase(kubectl, ns, "grow", "Running")
    # More capacity for the policy, on nodes that do not exist: its pod never runs.
    spec = {
        "jobRef": "grow",
        "policy": "solver",
        "rollout": {"replicas": 1, "nodeSelector": {"topology.kubernetes.io/region": "mars"}},
    }
    apply(kubectl, ns, {**GROUP, "metadata": {"name": "grow-mars"}, "spec": spec})

    def degraded() -> dict[str, Any] | None:
        ready = cond(status_of(kubectl, ns, "rlj", "grow"), "Ready")
        return ready if ready.get("reason") == "Degraded" else None

    ready = wait_until("Ready=False, Degraded", degraded, timeout=30)
    assert ready["status"] == "False"
    assert "solver: 1/2 rollouts serving" in ready["message"]
    assert status_of(kubectl, ns, "rlj", "grow")["phase"] == "Running"
    kubectl("delete", "pg", "grow-mars", "-n", ns)
    wait_until(
        "Ready again",
        lambda: condition(get(kubectl, ns, "rlj", "grow"), "Ready") == "True",
        timeout=30,
    )


def test_an_operator_without_signing_or_an_explicit_opt_in_refuses_to_start() -> None:
    env = {"PATH": "/usr/bin:/bin", "POLYRL_NATS_URL": "nats://127.0.0.1:1"}
    proc = subprocess.run(
        [sys.executable, "-m", "polyrl.operator"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no NATS signing Secret" in proc.stderr
    assert "POLYRL_NATS_INSECURE=true" in proc.stderr


def test_jobs_on_an_opted_in_shared_nats_say_every_pod_can_read_their_data(
    kubectl: Kubectl, ns: str, operator: OperatorProcess
) -> None:
    apply(kubectl, ns, job_doc("signed"))
    wait_until(
        "NatsIsolated True",
        lambda: condition(get(kubectl, ns, "rlj", "signed"), "NatsIsolated") == "True",
    )
    operator.use(
        operator.workers,
        settings={"POLYRL_NATS_SIGNING_SECRET": "", "POLYRL_NATS_INSECURE": "true"},
    )
    try:
        apply(kubectl, ns, job_doc("shared"))
        wait_until(
            "NatsIsolated False",
            lambda: condition(get(kubectl, ns, "rlj", "shared"), "NatsIsolated") == "False",
        )
        said = cond(status_of(kubectl, ns, "rlj", "shared"), "NatsIsolated")
        assert said["reason"] == "SharedNats"
        assert "every pod that can reach the NATS server can read and write" in said["message"]
        wait_until(
            "a NatsNotIsolated event", lambda: "NatsNotIsolated" in reasons(kubectl, ns, "shared")
        )
    finally:
        operator.use(operator.workers, settings={})


def test_a_running_job_stays_on_its_nats_when_the_operators_default_changes(
    kubectl: Kubectl, ns: str, operator: OperatorProcess, nats_server: NatsServer
) -> None:
    apply(kubectl, ns, job_doc("stay"))
    wait_phase(kubectl, ns, "stay", "Running")
    pinned = get(kubectl, ns, "rlj", "stay")["metadata"]["annotations"][naming.A_NATS_URL]
    assert pinned == nats_server.url
    pod = get(kubectl, ns, "pod", "stay-solver-rollout-0")
    operator.use(operator.workers, settings={"POLYRL_NATS_URL": "nats://127.0.0.1:1"})
    try:
        wait_until("a NatsKept event", lambda: "NatsKept" in reasons(kubectl, ns, "stay"))
        apply(kubectl, ns, job_doc("moved"))
        wait_until(  # the new default has no server: only new jobs notice
            "the new job on the new default",
            lambda: condition(get(kubectl, ns, "rlj", "moved"), "NatsReady") == "False",
            timeout=30,
        )
        job = get(kubectl, ns, "rlj", "stay")
        assert condition(job, "NatsReady") == "True"
        assert job["status"]["phase"] == "Running"
        now = get(kubectl, ns, "pod", "stay-solver-rollout-0")
        assert now["metadata"]["uid"] == pod["metadata"]["uid"]  # not rolled to another NATS
    finally:
        operator.use(operator.workers, settings={})
