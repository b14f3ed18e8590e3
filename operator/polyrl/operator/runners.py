"""An RLJob's workflow runners: the pods the job owns itself, beside its groups' pods.

They are created from the job's plan, replaced when they fail or their spec changes, with
backoff after failures (`scaling.backoff_over`), and freed while the job is suspended or once
it has ended. A runner that failed for invalid input (a workflow or task that cannot load, a
reward failing on every sample) ends the job as Failed: starting it again cannot help.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from polyrl.api import plan, queueing
from polyrl.api.base import now_rfc3339, seconds_since
from polyrl.api.resources import Phase
from polyrl.operator import admission, jobphase, natsusers, render, scaling
from polyrl.operator.jobpass import JobReconcile
from polyrl.operator.podinfo import PodInfo

log = logging.getLogger("polyrl.operator.jobs")


async def free(p: JobReconcile, pods: Sequence[PodInfo]) -> None:
    """The job's own pods (workflow runners) go; groups free theirs when they see the job."""
    await admission.release(p.ctx.kube, p.job, pods)
    for pod in pods:
        if not pod.deleting:
            await p.ctx.kube.delete_pod(p.ns, pod.name, pod.uid)


async def run(p: JobReconcile, pods: Sequence[PodInfo]) -> None:
    runners = [x for x in pods if x.role == "workflow"]
    await admission.let_go(p.ctx.kube, p.job, runners)
    if p.job.spec.suspend or queueing.refusal(p.job) is not None:
        await free(p, runners)
        return
    launches = plan.plan(
        p.job,
        nats_url=p.ctx.hub.url_of(p.job),
        entrypoints=p.ctx.settings.entrypoints,
        groups=[],
    ).workflow()
    owner = render.owner_ref("RLJob", p.name, p.job.metadata.uid or "")
    by_name = {x.name: x for x in runners}
    waiting = not scaling.backoff_over(p.status.last_failure_time, p.status.workflow_failures)
    for launch in launches:
        current = by_name.get(launch.name)
        body = render.pod(
            launch,
            namespace=p.ns,
            owner=owner,
            nats_secret=p.job.spec.nats.credentials_secret,
            nats_users=natsusers.secret_for(p.job, p.ctx.settings),
            job=p.job,
        )
        if current is None:
            if not waiting:
                await p.ctx.kube.create_pod(body)
        elif not current.deleting and (
            current.terminal or current.spec_hash != render.spec_hash(body["spec"])
        ):
            await p.ctx.kube.delete_pod(p.ns, current.name, current.uid)
            if current.phase == "Failed":
                _failed(p, current)
    await _retire_extra(p, runners, {launch.name for launch in launches})
    if not waiting and runners and all(x.ready for x in runners) and _calm(p):
        p.status.workflow_failures, p.status.last_failure = 0, None


async def _retire_extra(p: JobReconcile, runners: Sequence[PodInfo], wanted: set[str]) -> None:
    """Runners beyond `workflow.replicas` (it was lowered) go. Deleted, a runner gets SIGTERM
    and drains: its episodes in flight finish within the pod's grace period (sooner once
    nothing comes back for 5 s), nothing it emitted is lost (its publish window is flushed);
    the runners left are replaced with the new count in their spec, which sets each one's
    share of the episodes and of the staleness bound."""
    for pod in runners:
        if pod.name not in wanted and not pod.deleting:
            log.info("%s/%s: workflow runner %s retired (workflow.replicas is %d)",
                     p.ns, p.name, pod.name, p.job.spec.workflow.replicas)  # fmt: skip
            await p.ctx.kube.delete_pod(p.ns, pod.name, pod.uid)


def _failed(p: JobReconcile, pod: PodInfo) -> None:
    p.status.workflow_failures += 1
    p.status.last_failure_time = now_rfc3339()
    p.status.last_failure = pod.failure()
    delay = scaling.backoff_delay(p.status.workflow_failures)
    p.event(
        "Warning", "WorkflowRunnerFailed", f"{p.status.last_failure}; replacing it with backoff"
    )
    if pod.invalid_input:
        jobphase.end(p, Phase.FAILED, "InvalidInput", p.status.last_failure)
    log.info("%s/%s: workflow runner failed, next in %.0fs", p.ns, p.name, delay)


def _calm(p: JobReconcile) -> bool:
    """Thirty seconds without a workflow-runner failure."""
    last = p.status.last_failure_time
    return last is None or seconds_since(last) > 30
