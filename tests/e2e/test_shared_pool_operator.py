"""Two LoRA policies on one shared rollout pool under the operator, on the test cluster.

`kubectl apply` of a job whose verifier has `rollout.servedBy: solver`, in a namespace whose
pods the node agent runs as local processes with the real workers (as
tests/e2e/test_operator_job.py does): the verifier's PolicyGroup gets a trainer and no
rollout pod and names the pool; the solver's one rollout pod serves both policies (its
heartbeat's per-policy figures), and both trainers finish their steps. The first test runs
tiny models (in `make test`); the second the SmolLM2 solver-verifier example with both
policies as adapters (`examples/smollm2-solver-verifier-lora.yaml`, fewer steps), in
`make test-learning-smollm2`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator_stack import REPO, PodLogs, explained, wait_no_pod_processes

from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until
from polyrl.workers.models import catalog

from .test_operator_job import pods, rollout_heartbeats
from .test_shared_pool_run import JOB

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TINY = JOB  # the job of the `polyrl run` test, applied to the cluster


def run_shared(
    doc: dict[str, Any], kubectl: Kubectl, ns: str, url: str, logs: PodLogs, timeout: float
) -> None:
    job = doc["metadata"]["name"]
    kubectl("apply", "--validate=strict", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    started = time.monotonic()
    seen: set[tuple[str, str]] = set()  # (PolicyGroup, role) of every pod while it ran
    served = {"solver": 0, "verifier": 0}  # the pool's per-policy counts, as its beats said

    def beats() -> None:
        for beat in asyncio.run(rollout_heartbeats(url, JobNames(namespace=ns, job=job))):
            for policy, share in (beat.pool or {}).items():
                served[policy] = max(served[policy], share.requests_served)

    def succeeded() -> bool:
        logs.collect()
        for pod in pods(kubectl, ns, job):
            labels = pod["metadata"]["labels"]
            seen.add((labels.get("polyrl.dev/policy-group", ""), labels["polyrl.dev/role"]))
        beats()
        return phase(kubectl, ns, job) == "Succeeded"

    wait_until("the job Succeeded", succeeded, timeout=timeout, interval=1)
    beats()  # the pool's last heartbeat, where the run was over between two polls
    print(f"{job}: Succeeded in {time.monotonic() - started:.0f} s; pods {sorted(seen)}")
    status = kubectl.json("get", "pg", f"{job}-verifier", "-n", ns)["status"]
    assert status["servedBy"] == "solver", status
    assert status["step"] >= steps(doc, "verifier"), status
    assert (f"{job}-solver", "rollout") in seen, seen
    assert (f"{job}-verifier", "rollout") not in seen, seen  # never had one
    assert (f"{job}-verifier", "trainer") in seen, seen
    assert all(n > 0 for n in served.values()), served  # one pod served both policies


def phase(kubectl: Kubectl, ns: str, job: str) -> str:
    status = kubectl.json("get", "rlj", job, "-n", ns).get("status", {})
    assert status.get("phase") != "Failed", status
    return str(status.get("phase", ""))


def steps(doc: dict[str, Any], policy: str) -> int:
    spec = next(p for p in doc["spec"]["policies"] if p["name"] == policy)
    return int(spec["trainer"].get("steps") or doc["spec"]["stop"]["steps"])


def test_the_operator_runs_two_lora_policies_on_one_shared_pool_to_the_end(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    logs = PodLogs(cluster, real_ns, tmp_path / "pod-logs")
    doc = yaml.safe_load(TINY)
    # A name of its own: the node agent keeps trainer checkpoints by claim name, and a
    # trainer that finds one of an earlier run's resumes at its last step.
    doc["metadata"]["name"] = job = f"shared-{uuid.uuid4().hex[:6]}"
    doc["spec"]["stop"]["steps"] = 16  # serving long enough for a few heartbeats to say so
    with explained(kubectl, operator, logs):
        run_shared(doc, kubectl, real_ns, nats_server.url, logs, timeout=300)
        kubectl("delete", "rlj", job, "-n", real_ns, "--timeout=120s")
        wait_no_pod_processes(logs)


@pytest.mark.learning_smollm2
@pytest.mark.timeout(3600)
def test_the_operator_runs_the_smollm2_solver_and_verifier_as_adapters_on_one_pool(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    """The example as shipped, but 4 steps each and evaluated at the end only (the run under
    `polyrl run` is the learning figure; this one is the cluster path)."""
    doc = yaml.safe_load((REPO / "examples" / "smollm2-solver-verifier-lora.yaml").read_text())
    model = catalog.target(catalog.lookup("smollm2-135m-instruct"))
    if not model.exists():
        pytest.fail(f"{model} is missing: fetch it with `make smollm2`")
    doc["metadata"]["name"] = f"sv-lora-{uuid.uuid4().hex[:6]}"  # see the test above
    for policy in doc["spec"]["policies"]:
        policy["model"]["path"] = str(model)
        policy["trainer"] |= {"steps": 4, "evalEvery": 4}
    logs = PodLogs(cluster, real_ns, tmp_path / "pod-logs")
    with explained(kubectl, operator, logs):
        run_shared(doc, kubectl, real_ns, nats_server.url, logs, timeout=3000)
        wait_no_pod_processes(logs)
