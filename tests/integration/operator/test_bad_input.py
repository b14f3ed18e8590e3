"""Bad input found at run time becomes a condition that quotes its cause, within 60 s.

The real workers run here (exec-mode pods): they check what they can at start-up (the
workflow and task resolve, the model path is a causal LM) and say why they stop in their
termination message; the operator quotes it on the PolicyGroup and the RLJob. A refusal of
the input fails the job at once (running it again cannot help); other failures are retried
with backoff while the job shows it is not healthy. A spec the API server keeps but the
models refuse fails the job before anything starts (`InvalidSpec`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests.operator_stack import restricted_namespace

from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.operatorprocess import REAL_WORKERS, OperatorProcess
from polyrl.testing.waiting import wait_until

from .helpers import (
    REPO,
    apply,
    condition_of,
    events,
    find,
    get,
    job_doc,
    reasons,
    two_more_passes,
)

pytestmark = pytest.mark.slow

WITHIN = 60.0
GROUP = {"apiVersion": "polyrl.dev/v1alpha1", "kind": "PolicyGroup"}


@pytest.fixture
def real_ns(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    operator.use(REAL_WORKERS)
    yield from restricted_namespace(kubectl, "exec")


def bad_job(name: str, case: str) -> dict[str, Any]:
    """The cluster example (two policies, three rollout pods, all of whose workers start at
    once and contend for the CPUs) with one thing wrong."""
    doc = yaml.safe_load((REPO / "examples" / "solver-verifier.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    if case == "workflow":
        spec["workflow"]["name"] = "nosuchmodule:fn"
    elif case == "task":
        spec["workflow"]["task"] = {"name": "nosuchtask"}
    elif case == "model":
        spec["policies"][0]["model"]["path"] = "/does/not/exist"
    return dict(doc)


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("workflow", "No module named 'nosuchmodule'"),
        ("task", "unknown task 'nosuchtask'"),
        ("model", "model path '/does/not/exist' does not exist"),
    ],
)
def test_input_a_worker_refuses_fails_the_job_quoting_the_cause(
    kubectl: Kubectl, real_ns: str, case: str, cause: str
) -> None:
    ns, name = real_ns, f"bad-{case}"
    started = time.monotonic()
    apply(kubectl, ns, bad_job(name, case))

    def failed() -> dict[str, Any] | None:
        job = get(kubectl, ns, "rlj", name)
        return job if job.get("status", {}).get("phase") == "Failed" else None

    try:
        job = wait_until(f"job {name} Failed", failed, timeout=WITHIN)
    except AssertionError:
        print(kubectl("get", "pods,rlj,pg", "-n", ns, "-o", "wide").stdout)
        print(kubectl("get", "pods", "-n", ns, "-o", "yaml").stdout[-6000:])
        print(kubectl("get", "rlj", "-n", ns, "-o", "yaml").stdout[-4000:])
        raise
    seconds = time.monotonic() - started
    print(f"{case}: Failed after {seconds:.1f}s: {condition_of(job, 'Failed')}")
    said = condition_of(job, "Failed")
    assert said is not None
    assert said["status"] == "True"
    assert cause in said["message"]
    assert cause in (condition_of(job, "Ready") or {})["message"]
    assert cause in job["status"]["lastFailure"]

    def group_says_it() -> dict[str, Any] | None:  # on its own pass, after the job's
        group = get(kubectl, ns, "pg", f"{name}-solver")
        return group if cause in (condition_of(group, "Ready") or {}).get("message", "") else None

    group = wait_until(f"group {name}-solver quoting the cause", group_says_it, timeout=WITHIN)
    assert group["status"]["phase"] == "Failed"

    # The other policy's pods go too, and its health conditions say so, not "running".
    def freed() -> bool:
        group = get(kubectl, ns, "pg", f"{name}-verifier")
        said = [condition_of(group, kind) or {} for kind in ("TrainerHealthy", "RolloutsReady")]
        return all(c.get("status") == "False" and "no pods run" in c["message"] for c in said)

    wait_until(f"{name}-verifier's conditions: no pods run", freed, timeout=10)
    assert any(
        cause in e["message"]
        for e in events(kubectl, ns, name) + events(kubectl, ns, f"{name}-solver")
    )


def test_a_worker_that_keeps_failing_at_start_is_retried_and_the_job_shows_why(
    kubectl: Kubectl, real_ns: str
) -> None:
    # No NATS at this address: every worker stops at start with "cannot reach NATS" (exit 69:
    # worth retrying, so the job does not fail), again and again, with growing backoff.
    ns = real_ns
    doc = job_doc("no-nats", nats={"url": "nats://127.0.0.1:1"})
    doc["spec"]["policies"][0]["trainer"] = {"restartLimit": 20}
    apply(kubectl, ns, doc)

    def unhealthy() -> dict[str, Any] | None:
        job = get(kubectl, ns, "rlj", "no-nats")
        cond = condition_of(job, "WorkersHealthy")
        return (
            job
            if cond and cond["status"] == "False" and "cannot reach NATS" in cond["message"]
            else None
        )

    job = wait_until("the job to say its workers fail", unhealthy, timeout=WITHIN)
    assert job["status"]["phase"] == "Pending"  # not Running, not Failed
    assert condition(job, "Ready") == "False"

    def failures() -> list[dict[str, Any]]:
        said = [
            e for e in events(kubectl, ns, "no-nats-solver") if e["reason"] == "RolloutPodFailed"
        ]
        said += [e for e in events(kubectl, ns, "no-nats") if e["reason"] == "WorkflowRunnerFailed"]
        return said

    # Workers retry NATS for 10 s before they give up, then back off: a second failure of
    # the same kind raises the count of the first event instead of adding one.
    def counted_twice() -> list[dict[str, Any]] | None:
        said = failures()
        return said if max((e["count"] for e in said), default=0) >= 2 else None

    repeated = wait_until("a failure counted twice", counted_twice, timeout=45)
    assert len(repeated) <= 2, [e["message"] for e in repeated]  # one event per kind
    assert get(kubectl, ns, "rlj", "no-nats")["status"]["phase"] == "Pending"


def test_a_trainer_gang_that_cannot_meet_fails_within_its_rendezvous_timeout(
    kubectl: Kubectl, real_ns: str
) -> None:
    # A gang of three whose third pod cannot be scheduled (each asks for more than half of a
    # node's 32 CPUs, and the test cluster has two nodes): the two that run wait for it at the
    # rendezvous, give up after rendezvousTimeoutSeconds, and the group says so, quoting torchrun.
    ns = real_ns
    doc = job_doc("gang")
    doc["spec"]["policies"][0]["trainer"] = {
        "replicas": 3,
        "rendezvousTimeoutSeconds": 10,
        "restartLimit": 5,
        "resources": {"requests": {"cpu": "20"}},
    }
    started = time.monotonic()
    apply(kubectl, ns, doc)

    def said() -> dict[str, Any] | None:
        group = find(kubectl, ns, "pg", "gang-solver")  # None until the operator makes it
        cond = condition_of(group or {}, "WorkersHealthy")
        return cond if cond and cond["status"] == "False" else None

    # torchrun's timeout starts after each pod imported torch: tens of seconds on a busy node.
    cond = wait_until("the gang's failure on the group", said, timeout=2 * WITHIN)
    print(f"after {time.monotonic() - started:.0f}s: {cond['message']}")
    assert "trainer pod gang-solver-trainer-" in cond["message"]
    assert "Rendezvous" in cond["message"] or "rendezvous" in cond["message"]
    job = get(kubectl, ns, "rlj", "gang")
    assert "gang-solver" in (condition_of(job, "WorkersHealthy") or {})["message"]


def test_a_job_the_api_server_keeps_and_the_models_refuse_fails_naming_the_field(
    kubectl: Kubectl, ns: str, operator: OperatorProcess
) -> None:
    # The schema keeps a task's own params as given; a task param must be a scalar.
    name, log_start = "bad-params", len(operator.log())
    task = {"name": "arithmetic", "params": {"digits": [1, 2]}}
    apply(kubectl, ns, job_doc(name, workflow={"task": task}))

    def failed() -> dict[str, Any] | None:
        job = get(kubectl, ns, "rlj", name)
        return job if job.get("status", {}).get("phase") == "Failed" else None

    job = wait_until(f"job {name} Failed", failed, timeout=WITHIN)
    said = condition_of(job, "Failed")
    assert said is not None
    assert (said["status"], said["reason"]) == ("True", "InvalidSpec")
    assert (
        "spec.workflow.task.params.digits: Value error, a task param is a number"
        in (said["message"])
    )
    wait_until("an InvalidSpec event", lambda: "InvalidSpec" in reasons(kubectl, ns, name))
    two_more_passes(kubectl, operator, "rljob")  # they leave it as it is, and start nothing
    assert condition_of(get(kubectl, ns, "rlj", name), "Failed") == said
    assert kubectl.json("get", "pg,pods", "-n", ns)["items"] == []
    extra = {"jobRef": name, "policy": "solver", "rollout": {"replicas": 1}}
    apply(kubectl, ns, {**GROUP, "metadata": {"name": "more"}, "spec": extra})

    def group_said() -> dict[str, Any] | None:
        said = condition_of(get(kubectl, ns, "pg", "more"), "Ready")
        return said if said and said["reason"] == "JobInvalid" else None

    said = wait_until("the group's JobInvalid", group_said, timeout=WITHIN)
    assert "spec.workflow.task.params.digits" in said["message"]
    assert kubectl.json("get", "pods", "-n", ns)["items"] == []
    kubectl("delete", "rlj", name, "-n", ns, "--timeout=30s")  # the finalizer lets it go
    assert "Traceback" not in operator.log()[log_start:]
