"""The operator benchmark's serving part: a real job scaled up, timed to Running and to Ready.

In a namespace whose pods the node agent runs (`agent.polyrl.dev/mode=exec`: the real
workers, `polyrl worker ...` and torchrun, with a tiny model), one job trains one policy.
Once it is Running (its trainer trains, its rollout serves, its workflow runner runs
episodes), its group is scaled up by `step` through the scale subresource, and two times are
taken from the patch: until every new pod runs (its process started) and until every new pod
is Ready, which its readiness probe makes "serves the current weights" (the worker imported
torch, fetched the model bundle from NATS, loaded the latest weights and said so in a
heartbeat). The first is what Kubernetes alone can promise; the second is what a user waits
for, and what `polyrl_operator_scale_seconds` measures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from polyrl.api import naming
from polyrl.api.base import GROUP, VERSION
from polyrl.bench.operator_common import say
from polyrl.bench.operator_pods import PodWatch, all_ready, all_running, rollouts_of
from polyrl.testing.kube import Kubectl
from polyrl.testing.waiting import wait_until

SERVING_NS = "polyrl-bench-serving"
JOB = "serving"
POLICY = "solver"


@dataclass(frozen=True, slots=True)
class ScaleToServing:
    step: int
    job_running_s: float  # from the create to the job Running (every worker serving)
    to_running_s: float  # from the scale patch to every new pod Running
    to_ready_s: float  # ... to every new pod Ready: serving

    def figures(self) -> dict[str, Any]:
        return {
            "serving_scale_step": self.step,
            "serving_job_running_s": round(self.job_running_s, 2),
            "scale_up_to_running_s": round(self.to_running_s, 2),
            "scale_up_to_serving_s": round(self.to_ready_s, 2),
        }


def job_doc() -> dict[str, Any]:
    """One policy, trained without end, one rollout pod, the default workflow and task."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RLJob",
        "metadata": {"name": JOB},
        "spec": {
            "policies": [
                {
                    "name": POLICY,
                    "model": {"path": "tiny-llama://bench-serving"},
                    "trainer": {"batchSize": 16, "microBatchSize": 16},
                    "rollout": {"replicas": 1, "maxReplicas": 64, "drainTimeoutSeconds": 5},
                }
            ],
            "workflow": {"episodesInFlight": 4},
        },
    }


def make_namespace(kubectl: Kubectl) -> None:
    kubectl.apply(
        f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {SERVING_NS}\n"
        "  labels:\n    agent.polyrl.dev/mode: exec\n"
    )
    wait_until(
        f"the default ServiceAccount in {SERVING_NS}",
        lambda: kubectl("get", "sa", "default", "-n", SERVING_NS, check=False).returncode == 0,
    )


def _phase(api: client.ApiClient) -> str:
    job = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, SERVING_NS, "rljobs", JOB
    )
    return str((job.get("status") or {}).get("phase", ""))


def measure(api: client.ApiClient, kubectl: Kubectl, step: int) -> ScaleToServing:
    make_namespace(kubectl)
    watch = PodWatch(api, namespace=SERVING_NS)
    watch.start()
    custom = client.CustomObjectsApi(api)
    try:
        t0 = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, SERVING_NS, "rljobs", job_doc())
        wait_until("the serving job Running", lambda: _phase(api) == "Running", timeout=600)
        running = time.monotonic() - t0
        say(f"serving: the job's workers serve after {running:.1f}s; scaling up by {step}")
        group = naming.policy_group(JOB, POLICY)
        before = set(rollouts_of(group, watch.snapshot()))
        patch = {"spec": {"replicas": 1 + step}}
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, SERVING_NS, "policygroups", group, patch
        )
        t1 = time.monotonic()
        watch.wait(f"{step} new pods", lambda pods: _exist(group, before, step, pods), 60)
        new = set(rollouts_of(group, watch.snapshot())) - before
        ran = watch.wait(f"{step} new pods Running", all_running(new), 120)
        ready = watch.wait(f"{step} new pods Ready (serving)", all_ready(new), 600)
        say(f"serving: +{step} Running in {ran - t1:.1f}s, Ready (serving) in {ready - t1:.1f}s")
        return ScaleToServing(step, running, ran - t1, ready - t1)
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, SERVING_NS, "rljobs", JOB)
        wait_until("the serving job's pods gone", lambda: not _pods(api), timeout=120)
        watch.stop()


def _exist(group: str, before: set[str], count: int, pods: Any) -> float | None:
    new = set(rollouts_of(group, pods)) - before
    return time.monotonic() if len(new) >= count else None


def _pods(api: client.ApiClient) -> list[Any]:
    items: list[Any] = client.CoreV1Api(api).list_namespaced_pod(SERVING_NS).items
    return items
