"""Admission by Kueue: which of a job's pods Kueue admits together, and how they say so.

An RLJob labelled `kueue.x-k8s.io/queue-name` is queued. polyrl takes Kueue's plain
pod-group path (no controller of ours inside Kueue): its pods carry the queue label, and
Kueue's pod webhook holds each behind the `kueue.x-k8s.io/admission` scheduling gate until
its Workload is admitted, so no worker container runs before.

What is one Workload:
- **The gang**: the workflow runners, every policy's trainer pods (or a frozen policy's
  publisher) and each policy's first `rollout.minReplicas` rollout pods, one pod group
  (`kueue.x-k8s.io/pod-group-name`, the job's name and uid) with their total count: admitted
  together, all or nothing, so a half-started job never holds accelerators while it waits.
- **Each rollout replica above the minimum** on its own (a plain pod: a Workload of one), as
  LeaderWorkerSet's groups are, so `kubectl scale pg` works under a quota: a new replica waits
  for admission while the admitted ones keep serving, and scaling down releases its quota.

Kueue splits a pod group into PodSets by each pod's shape (requests, ports, node selector,
affinity, tolerations; labels and images do not count), and a Workload of Kueue v0.17 holds
at most 8 PodSets, so the gang's distinct shapes are counted before any pod is made
(`podset_count`): a job that would need more is refused with a condition naming the limit.
Pods need requests for a quota to bind: a queued pod without any asks for DEFAULT_REQUESTS.
"""

from __future__ import annotations

import json
from typing import Any

from polyrl.api import naming, plan
from polyrl.api.base import Resources
from polyrl.api.launch import Role, WorkerLaunch
from polyrl.api.resources import RLJob

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# Set on a group's pods as the operator frees them for good (suspended, ended, deleted):
# Kueue then finishes the group's Workload once none runs, and its quota is released (a
# retriable group's Workload would wait for replacements that never come).
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
FINALIZER = "kueue.x-k8s.io/managed"  # Kueue's on the pods it manages
MAX_PODSETS = 8  # Kueue v0.17's limit per Workload (its API validation)
DEFAULT_REQUESTS = {"cpu": "1", "memory": "2Gi"}


def queue_name(job: RLJob) -> str | None:
    """The LocalQueue the job waits in, or None: not queued, its pods start at once."""
    return job.metadata.labels.get(QUEUE_LABEL) or None


def gang_name(job: RLJob) -> str:
    """The pod group of the gang: unique to this job object (a job deleted and made again
    under its name is another group) and to its round (each resume after a user's
    suspension is a new Workload: the last one finished when its pods were freed), at most
    63 characters."""
    uid = (job.metadata.uid or "")[:8]
    name = f"{job.metadata.name[:50]}-{uid}" if uid else job.metadata.name[:59]
    return f"{name}-{job.status.queue_round}" if job.status.queue_round else name


def in_gang(job: RLJob, launch: WorkerLaunch) -> bool:
    """Runners, trainers, publishers and the first minReplicas rollouts of a group the job
    owns (another region's PolicyGroup for a policy is elastic capacity: each its own)."""
    if launch.role == Role.WORKFLOW:
        return True
    policy = job.spec.policy(launch.policy or "")
    if policy is None or launch.policy_group != naming.policy_group(job.metadata.name, policy.name):
        return False
    return launch.role != Role.ROLLOUT or launch.replica < gang_rollouts(job, launch.policy_group)


def gang_rollouts(job: RLJob, group: str) -> int:
    """How many of `group`'s first rollout indices are in the gang: the policy's
    minReplicas for a group the job owns, none for another region's."""
    for policy in job.spec.policies:
        if group == naming.policy_group(job.metadata.name, policy.name):
            return 0 if policy.rollout.served_by else policy.rollout.min_replicas
    return 0


def gang_size(job: RLJob) -> int:
    """How many pods the gang has, from the job's spec (the groups it owns)."""
    size = job.spec.workflow.replicas
    for policy in job.spec.policies:
        size += 1 if policy.frozen else policy.trainer.replicas
        if policy.rollout.served_by is None:
            size += policy.rollout.min_replicas
    return size


def pod_metadata(job: RLJob, launch: WorkerLaunch) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations that put `launch`'s pod in Kueue's hands (none when the
    job is not queued)."""
    queue = queue_name(job)
    if queue is None:
        return {}, {}
    labels = {QUEUE_LABEL: queue}
    if priority := job.metadata.labels.get(PRIORITY_LABEL):
        labels[PRIORITY_LABEL] = priority
    if not in_gang(job, launch):
        return labels, {}
    labels[GROUP_LABEL] = gang_name(job)
    return labels, {TOTAL_ANNOTATION: str(gang_size(job))}


def with_default_requests(job: RLJob, launch: WorkerLaunch) -> WorkerLaunch:
    """A queued pod without requests asks for DEFAULT_REQUESTS, so its quota binds."""
    if queue_name(job) is None or (launch.resources and launch.resources.requests):
        return launch
    limits = launch.resources.limits if launch.resources else {}
    resources = Resources(requests=dict(DEFAULT_REQUESTS), limits=limits)
    return launch.model_copy(update={"resources": resources})


def podset_count(launches: list[WorkerLaunch]) -> int:
    """How many PodSets Kueue makes of these pods: one per distinct shape of what it
    hashes (requests, node selector, tolerations; ports and affinity are the same for
    every pod of a role here)."""

    def shape(launch: WorkerLaunch) -> str:
        requests = launch.resources.requests if launch.resources else {}
        return json.dumps(
            {
                "requests": {k: str(v) for k, v in requests.items()},
                "nodeSelector": launch.node_selector,
                "tolerations": [t.model_dump(mode="json") for t in launch.tolerations],
                "trainer": launch.role == Role.TRAINER,  # its rendezvous port
            },
            sort_keys=True,
        )

    return len({shape(x) for x in launches})


def refusal(job: RLJob) -> str | None:
    """Why Kueue could not admit the job's gang (more PodSets than a Workload holds), or
    None. The operator starts none of a refused job's pods."""
    if queue_name(job) is None:
        return None
    launches = [
        with_default_requests(job, x)
        for x in plan.plan(job, nats_url="nats://unused").launches
        if in_gang(job, x)
    ]
    count = podset_count(launches)
    return too_many_podsets(count) if count > MAX_PODSETS else None


def too_many_podsets(count: int) -> str:
    return (
        f"the job's gang needs {count} Kueue PodSets (one per distinct pod shape: requests, "
        f"node selector, tolerations) and Kueue admits at most {MAX_PODSETS} per Workload; "
        "give roles the same resources, or fewer policies"
    )


def gated(pod: dict[str, Any]) -> bool:
    """True while Kueue holds the pod back."""
    gates = pod.get("spec", {}).get("schedulingGates") or []
    return any(g.get("name") == ADMISSION_GATE for g in gates)
