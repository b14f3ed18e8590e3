"""Reconciling one PolicyGroup: its trainer (if any), its rollout pool, its status.

One pass compares what should run (from `plan.group_launches`) with the pods in the index
and acts: creates missing pods, replaces failed ones with backoff, restarts a failed
trainer as a gang up to `restartLimit`, rolls out spec changes, and scales the rollout pool
down drain-first (see `scaling.victims`). Problems the schema cannot catch (no such job or
policy, a job the models refuse, a second trainer) become `Ready=False` conditions with a
reason, and no pods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from polyrl.api import naming, plan
from polyrl.api._version import DEFAULT_IMAGE
from polyrl.api.base import (
    ConditionStatus,
    ConditionType,
    find_condition,
    now_rfc3339,
    seconds_since,
)
from polyrl.api.launch import Role, WorkerLaunch
from polyrl.api.messages import Heartbeat, WorkerState
from polyrl.api.resources import Phase, PolicyGroup, PolicyGroupStatus, PolicySpec, RLJob
from polyrl.operator import (
    flow,
    metrics,
    natsusers,
    progress,
    refused,
    render,
    report,
    scaling,
)
from polyrl.operator.context import Context
from polyrl.operator.podinfo import PodInfo

log = logging.getLogger("polyrl.operator.groups")
FINISHED = "the trainer finished its last step"


@dataclass
class Pass(report.Recorder):
    """The state of one reconcile pass over a group."""

    ctx: Context
    body: Mapping[str, Any]
    group: PolicyGroup
    pods: list[PodInfo]
    status: PolicyGroupStatus
    job: RLJob | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    leaving: set[str] = field(default_factory=set)  # pods drained or deleted this pass
    created: int = 0
    blocked: bool = False  # this pass found the group unable to run (reason in Ready)
    idle: bool = False  # ... and runs no pods at all (`_idle`: every condition says why)
    has_service: bool = False  # the trainer's headless Service exists (from the index)

    @property
    def name(self) -> str:
        return self.group.metadata.name

    @property
    def namespace(self) -> str:
        return self.group.metadata.namespace

    @property
    def generation(self) -> int:
        return self.group.metadata.generation


def load(body: Mapping[str, Any]) -> PolicyGroup:
    return report.load(PolicyGroup, body)


async def reconcile(
    ctx: Context,
    body: Mapping[str, Any],
    pods: Sequence[PodInfo],
    job_body: Mapping[str, Any] | None,
    *,
    has_service: bool = False,
) -> None:
    started = time.monotonic()
    group = load(body)
    p = Pass(
        ctx=ctx,
        body=body,
        group=group,
        pods=list(pods),
        status=group.status.model_copy(deep=True),
        has_service=has_service,
    )
    await _run(p, job_body)
    await _finish(p)
    metrics.RECONCILE_SECONDS.labels(kind="policygroup").observe(time.monotonic() - started)
    metrics.RECONCILES.labels(kind="policygroup").inc()


async def _run(p: Pass, job_body: Mapping[str, Any] | None) -> None:
    try:
        p.job = RLJob.model_validate(_job_doc(job_body)) if job_body else None
    except ValidationError as err:  # the job says so too, Failed (refused.py)
        why = f"RLJob {p.group.spec.job_ref!r} cannot run: {refused.explain(err)}"
        await _idle(p, Phase.FAILED, "JobInvalid", f"{why}; no pods are started")
        return
    policy = p.job.spec.policy(p.group.spec.policy) if p.job else None
    if p.job is None or policy is None:
        reason = "JobNotFound" if p.job is None else "PolicyNotFound"
        what = (
            f"RLJob {p.group.spec.job_ref!r}"
            if p.job is None
            else f"policy {p.group.spec.policy!r} in RLJob {p.group.spec.job_ref!r}"
        )
        await _idle(p, Phase.PENDING, reason, f"{what} does not exist; no pods are started")
        return
    job_phase = Phase(p.job.status.phase)
    if p.job.spec.suspend or job_phase.is_terminal():
        reason = "Suspended" if p.job.spec.suspend else job_phase.value
        why = "the job is suspended" if p.job.spec.suspend else _ended(p.job)
        await _idle(p, Phase.SUSPENDED if p.job.spec.suspend else job_phase, reason, why)
        return
    launches = plan.group_launches(
        p.job,
        p.group,
        policy,
        nats_url=p.ctx.hub.url_of(p.job),
        entrypoints=p.ctx.settings.entrypoints,
    )
    await _trainer(p, policy, [x for x in launches if x.role == Role.TRAINER])
    await _rollouts(p, [x for x in launches if x.role == Role.ROLLOUT])


def _ended(job: RLJob) -> str:
    """Why the job ended, as its own conditions say (a failure's cause, quoted)."""
    said = find_condition(job.status.conditions, ConditionType.STOPPED)
    return f"the job has ended: {said.message}" if said and said.message else "the job has ended"


async def _idle(p: Pass, phase: Phase, reason: str, message: str) -> None:
    """The group runs no pods (it cannot, or its job is suspended or over): Ready False
    saying why, and its health conditions say that its pods are gone; a failure the group
    recorded itself stays in WorkersHealthy."""
    failed_itself = p.group.status.phase == Phase.FAILED
    p.condition(ConditionType.READY, False, reason, message)
    gone = f"{message}; no pods run"
    if p.status.trainer_completed:  # it did all it had to: healthy, and gone
        p.condition(ConditionType.TRAINER_HEALTHY, True, "Completed", f"{FINISHED}; no pods run")
    elif p.group.spec.trainer is not None:
        p.condition(ConditionType.TRAINER_HEALTHY, False, reason, gone)
    p.condition(ConditionType.ROLLOUTS_READY, False, reason, gone)
    if not failed_itself:
        p.condition(ConditionType.WORKERS_HEALTHY, False, reason, gone)
    p.status.phase, p.blocked, p.idle = phase, True, True
    p.status.replicas = p.status.ready_replicas = 0
    p.status.trainer_pods = p.status.trainer_ready_pods = 0
    p.status.selector = naming.active_rollout_selector(p.name)
    await _delete_all(p, p.pods)


def _job_doc(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "metadata": dict(body["metadata"]),
        "spec": dict(body["spec"]),
        "status": dict(body.get("status") or {}),
    }


def _owner(p: Pass) -> dict[str, Any]:
    return render.owner_ref("PolicyGroup", p.name, p.group.metadata.uid or "")


def _grace(p: Pass) -> int:
    return p.group.spec.rollout.drain_timeout_seconds + 10


def _render(p: Pass, launch: WorkerLaunch) -> dict[str, Any]:
    assert p.job is not None
    secret = p.job.spec.nats.credentials_secret or p.ctx.settings.nats_credentials_secret
    if p.ctx.settings.default_image and launch.image == DEFAULT_IMAGE:
        launch = launch.model_copy(update={"image": p.ctx.settings.default_image})
    return render.pod(
        launch,
        namespace=p.namespace,
        owner=_owner(p),
        nats_secret=secret,
        nats_users=natsusers.secret_for(p.job, p.ctx.settings),
        grace_seconds=_grace(p),
    )


async def _delete_all(p: Pass, pods: Sequence[PodInfo]) -> None:
    for pod in pods:
        if not pod.deleting:
            await p.ctx.kube.delete_pod(p.namespace, pod.name, pod.uid)
            p.leaving.add(pod.name)


# --- trainer -------------------------------------------------------------------------------


def _trainer_allowed(p: Pass) -> bool:
    """Only the group the job owns trains; a trainer declared elsewhere is refused."""
    assert p.job is not None
    owned = any(
        ref.get("uid") == p.job.metadata.uid
        for ref in p.body["metadata"].get("ownerReferences") or []
    )
    if p.group.spec.trainer is not None and not owned:
        p.blocked = True
        p.condition(
            ConditionType.READY,
            False,
            "DuplicateTrainer",
            f"policy {p.group.spec.policy!r} already has its trainer in "
            f"{naming.policy_group(p.job.metadata.name, p.group.spec.policy)}; this "
            "group runs rollouts only (remove spec.trainer)",
        )
        return False
    return p.group.spec.trainer is not None


async def _trainer(p: Pass, policy: PolicySpec, launches: list[WorkerLaunch]) -> None:
    pods = [x for x in p.pods if x.role == Role.TRAINER.value]
    if not _trainer_allowed(p):
        await _delete_all(p, pods)
        p.status.trainer_pods = 0
        return
    trainer = p.group.spec.trainer
    assert trainer is not None
    if not p.has_service:
        await p.ctx.kube.ensure_service(render.trainer_service(p.group, owner=_owner(p)))
    rendered = {x.name: _render(p, x) for x in launches}
    failed = [x for x in pods if x.phase == "Failed" and not x.deleting]
    if (pods and all(x.phase == "Succeeded" for x in pods)) or _trainer_done(p):
        p.status.trainer_completed = True
    if p.status.trainer_completed:
        pass  # finished: never started again, its pods left as they are until the job ends
    elif failed:
        await _restart_trainer(p, pods, failed, trainer.restart_limit)
    elif lost := _lost_trainer_pods(p, pods, len(launches)):
        await _replace_lost_trainer(p, pods, lost, trainer.restart_limit)
    elif any(x.deleting for x in pods):
        pass  # a gang restart or update is under way: wait until the old pods are gone
    elif any(x.spec_hash != _hash(rendered.get(x.name)) for x in pods):
        await _delete_all(p, pods)
        why = "trainer spec changed; restarting the trainer pods"
        p.condition(ConditionType.TRAINER_HEALTHY, False, "Updating", why)
        p.event("Normal", "TrainerUpdated", why)
    elif scaling.backoff_over(p.status.last_failure_time, p.status.trainer_restarts):
        await _create_missing(p, rendered, {x.name for x in pods})
    _trainer_status(p, pods, len(launches), failed=bool(failed))


def _lost_trainer_pods(p: Pass, pods: list[PodInfo], wanted: int) -> list[str]:
    """Trainer pods that were running at the last pass and are now gone or going, though
    the operator did not delete them (a `kubectl delete pod`, an eviction, a lost node)."""
    if not p.group.status.trainer_pods:
        return []  # nothing was running (or the operator itself took it down last pass)
    going = [x.name for x in pods if x.deleting]
    missing = wanted - len(pods)
    return going + (["(gone)"] * missing if missing > 0 else [])


async def _replace_lost_trainer(p: Pass, pods: list[PodInfo], lost: list[str], limit: int) -> None:
    """A lost trainer pod restarts the gang from its checkpoint, counted like a failure."""
    names = ", ".join(x for x in lost if x != "(gone)") or "a trainer pod"
    await _delete_all(p, pods)
    if p.status.trainer_restarts >= limit:
        p.status.phase = Phase.FAILED
        message = f"trainer pod {names} was lost after {limit} restarts"
        p.condition(ConditionType.TRAINER_HEALTHY, False, "RestartLimitExceeded", message)
        p.condition(ConditionType.WORKERS_HEALTHY, False, "RestartLimitExceeded", message)
        p.event("Warning", "TrainerFailed", message)
        return
    p.status.trainer_restarts += 1
    message = (
        f"trainer pod {names} went away (deleted or evicted); restarting the trainer from its "
        f"checkpoint (restart {p.status.trainer_restarts}/{limit})"
    )
    p.condition(ConditionType.TRAINER_HEALTHY, False, "Restarting", message)
    p.event("Warning", "TrainerRestarted", message)


def _trainer_status(p: Pass, pods: list[PodInfo], wanted: int, *, failed: bool) -> None:
    """TrainerHealthy and the trainer's pod counts. Running pods are healthy; Ready ones
    train (rank 0 said so in a heartbeat; the others follow it)."""
    running = [
        x for x in pods if x.phase == "Running" and not x.deleting and x.name not in p.leaving
    ]
    ready = [x for x in running if x.ready]
    p.status.trainer_pods, p.status.trainer_ready_pods = len(running), len(ready)
    if p.status.trainer_completed:
        p.condition(ConditionType.TRAINER_HEALTHY, True, "Completed", FINISHED)
    elif p.status.phase == Phase.FAILED or failed or p.leaving & {x.name for x in pods}:
        return  # said where it failed, or is restarting
    elif len(running) < wanted:
        p.condition(
            ConditionType.TRAINER_HEALTHY,
            False,
            "Starting",
            f"{len(running)}/{wanted} trainer pods running",
        )
    elif len(ready) < wanted:
        p.condition(
            ConditionType.TRAINER_HEALTHY,
            True,
            "Preparing",
            f"{wanted}/{wanted} trainer pods running, {len(ready)} ready: loading the model, "
            "warming up or evaluating before its first RL step",
        )
    else:
        p.condition(
            ConditionType.TRAINER_HEALTHY,
            True,
            "Running",
            f"{wanted}/{wanted} trainer pods running and training",
        )


def _trainer_done(p: Pass) -> bool:
    """The trainer said, in its last heartbeat, that it is past its last step."""
    return any(
        hb.state == WorkerState.DONE for hb in _heartbeats(p) if hb.role == Role.TRAINER.value
    )


def _hash(body: Mapping[str, Any] | None) -> str:
    return render.spec_hash(body["spec"]) if body else ""


async def _restart_trainer(p: Pass, pods: list[PodInfo], failed: list[PodInfo], limit: int) -> None:
    names = ", ".join(x.name for x in failed)
    await _delete_all(p, pods)
    _record_failure(p, failed[0])
    if any(x.invalid_input for x in failed):
        return  # _record_failure failed the group: restarting cannot help
    if p.status.trainer_restarts >= limit:
        p.status.phase = Phase.FAILED
        message = f"trainer pod(s) {names} failed after {limit} restarts; {p.status.last_failure}"
        p.condition(ConditionType.TRAINER_HEALTHY, False, "RestartLimitExceeded", message)
        p.condition(ConditionType.WORKERS_HEALTHY, False, "RestartLimitExceeded", message)
        p.event(
            "Warning", "TrainerFailed", f"restart limit {limit} reached: {p.status.last_failure}"
        )
        return
    p.status.trainer_restarts += 1
    p.condition(
        ConditionType.TRAINER_HEALTHY,
        False,
        "Restarting",
        f"restart {p.status.trainer_restarts}/{limit}: {p.status.last_failure}",
    )
    p.event("Warning", "TrainerRestarted", f"trainer failed, restarting: {p.status.last_failure}")


def _record_failure(p: Pass, pod: PodInfo) -> None:
    """Keep what a failed pod said; a refusal of its input fails the whole group at once."""
    p.status.last_failure = pod.failure()
    p.status.last_failure_time = now_rfc3339()
    if pod.invalid_input:
        p.status.phase = Phase.FAILED
        p.condition(ConditionType.READY, False, "InvalidInput", p.status.last_failure)
        p.condition(ConditionType.WORKERS_HEALTHY, False, "InvalidInput", p.status.last_failure)
        p.event("Warning", "InvalidInput", f"{p.status.last_failure}; the policy failed")


async def _create_missing(
    p: Pass, rendered: Mapping[str, dict[str, Any]], existing: set[str]
) -> int:
    made = 0
    for name, body in rendered.items():
        if name not in existing and await p.ctx.kube.create_pod(body):
            made += 1
    return made


# --- rollouts ------------------------------------------------------------------------------


async def _rollouts(p: Pass, launches: list[WorkerLaunch]) -> None:
    pods = [x for x in p.pods if x.role == Role.ROLLOUT.value]
    template = launches[0] if launches else _template(p)
    await _replace_terminal(p, [x for x in pods if x.terminal and not x.deleting])
    await _finish_drains(p, [x for x in pods if x.draining and not x.deleting and not x.terminal])
    active = [x for x in pods if x.active]
    desired = p.group.spec.rollout.replicas
    if len(active) > desired:
        for victim in scaling.victims(active, len(active) - desired):
            await _start_drain(p, victim, "ScaledDown")
    elif len(active) < desired:
        if scaling.backoff_over(p.status.last_failure_time, p.status.rollout_failures):
            await _scale_up(p, template, pods, desired - len(active))
    else:
        await _roll_one(p, template, active, pods)
    _rollout_status(p, [x for x in active if x.name not in p.leaving])


def _template(p: Pass) -> WorkerLaunch:
    assert p.job is not None
    policy = p.job.spec.policy(p.group.spec.policy)
    assert policy is not None
    return plan.rollout_template(
        p.job,
        p.group,
        policy,
        nats_url=p.ctx.hub.url_of(p.job),
        entrypoints=p.ctx.settings.entrypoints,
    )


def _rollout_body(p: Pass, template: WorkerLaunch, replica: int) -> dict[str, Any]:
    return _render(p, template.with_replica(replica, naming.rollout_pod(p.name, replica)))


async def _replace_terminal(p: Pass, pods: list[PodInfo]) -> None:
    for pod in pods:
        await p.ctx.kube.delete_pod(p.namespace, pod.name, pod.uid)
        p.leaving.add(pod.name)
        if pod.phase == "Failed" and not pod.draining:
            p.status.rollout_failures += 1
            _record_failure(p, pod)
            p.event("Warning", "RolloutPodFailed", f"{p.status.last_failure}; replacing it")


async def _scale_up(p: Pass, template: WorkerLaunch, pods: list[PodInfo], count: int) -> None:
    used = [x.replica for x in pods if x.name not in p.leaving or not x.terminal]
    made = 0
    for replica in scaling.free_indices(used, count):
        if await p.ctx.kube.create_pod(_rollout_body(p, template, replica)):
            made += 1
    p.created += count
    if made:
        p.event("Normal", "ScaledUp", f"created {made} rollout pod(s)")


async def _roll_one(
    p: Pass, template: WorkerLaunch, active: list[PodInfo], pods: list[PodInfo]
) -> None:
    """Replace outdated pods one at a time, drain-first (the replacement starts at once)."""
    if any(x.draining for x in pods):
        return
    for pod in sorted(active, key=lambda x: x.replica):
        if pod.spec_hash != _hash(_rollout_body(p, template, pod.replica)):
            await _start_drain(p, pod, "SpecChanged")
            return


async def _start_drain(p: Pass, pod: PodInfo, why: str) -> None:
    if not _has_served(p, pod.name):
        # Nothing to drain: it never pulled a request (one it did not answer would come back
        # to the queue anyway), and it may not listen for drain requests yet.
        await p.ctx.kube.delete_pod(p.namespace, pod.name, pod.uid)
        p.leaving.add(pod.name)
        metrics.DRAINS.labels(outcome="never-served").inc()
        p.event(
            "Normal", "Deleted", f"deleted rollout pod {pod.name} at once ({why}): it never served"
        )
        return
    patch = {
        "metadata": {
            "labels": {naming.L_DRAINING: "true"},
            "annotations": {naming.A_DRAIN_STARTED: f"{time.time():.3f}"},
        }
    }
    await p.ctx.kube.patch_pod(p.namespace, pod.name, patch)
    p.leaving.add(pod.name)
    p.event("Normal", "Draining", f"draining rollout pod {pod.name} ({why})")
    await _request_drain(p, pod)


async def _request_drain(p: Pass, pod: PodInfo) -> None:
    assert p.job is not None
    p.ctx.drain_requested.add((p.namespace, pod.name))
    await p.ctx.hub.request_drain(
        p.job, p.group.spec.policy, pod.name, float(p.group.spec.rollout.drain_timeout_seconds)
    )


async def _finish_drains(p: Pass, pods: list[PodInfo]) -> None:
    assert p.job is not None
    channel = p.ctx.hub.channel(p.namespace, p.job.metadata.name)
    timeout = p.group.spec.rollout.drain_timeout_seconds
    for pod in pods:
        drained = channel is not None and pod.name in channel.drained
        overdue = time.time() - (pod.drain_started or 0.0) >= timeout
        if drained or overdue:
            await p.ctx.kube.delete_pod(p.namespace, pod.name, pod.uid)
            p.leaving.add(pod.name)
            metrics.DRAINS.labels(outcome="drained" if drained else "timeout").inc()
            p.event(
                "Normal" if drained else "Warning",
                "Drained" if drained else "DrainTimeout",
                f"rollout pod {pod.name} "
                + ("drained; deleted" if drained else f"did not drain within {timeout}s; deleted"),
            )
            if channel is not None:
                channel.drained.pop(pod.name, None)
        elif (p.namespace, pod.name) not in p.ctx.drain_requested:
            await _request_drain(p, pod)  # the operator restarted mid-drain: ask again


def _rollout_status(p: Pass, active: list[PodInfo]) -> None:
    desired = p.group.spec.rollout.replicas
    p.status.replicas = len(active) + p.created
    p.status.ready_replicas = sum(1 for x in active if x.ready)
    p.status.selector = naming.active_rollout_selector(p.name)
    problem = next((x.problem for x in active if x.problem), None)
    if problem is not None:
        p.condition(
            ConditionType.ROLLOUTS_READY,
            False,
            problem[0],
            problem[1] or "a rollout pod cannot run",
        )
    else:
        ok = p.status.ready_replicas >= desired
        p.condition(
            ConditionType.ROLLOUTS_READY,
            ok,
            "Ready" if ok else "Waiting",
            f"{p.status.ready_replicas}/{desired} rollout pods ready",
        )
    if ok_to_reset(p):
        p.status.rollout_failures = 0
        p.status.last_failure = None


def ok_to_reset(p: Pass) -> bool:
    """Failures are forgotten once every pod has been ready for 30 s since the last one."""
    desired = p.group.spec.rollout.replicas
    trainer = find_condition(p.status.conditions, ConditionType.TRAINER_HEALTHY)
    if trainer is not None and trainer.status != ConditionStatus.TRUE:
        return False
    if not (p.status.rollout_failures or p.status.last_failure):
        return False
    if p.status.ready_replicas < desired:
        return False
    last = p.status.last_failure_time
    return last is None or seconds_since(last) > 30


# --- status --------------------------------------------------------------------------------


def _heartbeats(p: Pass) -> list[Heartbeat]:
    """The latest heartbeats of this group's pods that exist (the operator's mirror keeps
    a heartbeat after its key expires: a pod scaled away must not speak for the group)."""
    if p.job is None:
        return []
    channel = p.ctx.hub.channel(p.namespace, p.job.metadata.name)
    if channel is None:
        return []
    here = {x.name for x in p.pods if not x.deleting}
    return [
        hb
        for hb in channel.heartbeats.values()
        if hb.policy == p.group.spec.policy and hb.pod in here
    ]


def _has_served(p: Pass, pod: str) -> bool:
    """The pod said it serves (or drains) in a heartbeat."""
    serving = (WorkerState.SERVING, WorkerState.DRAINING, WorkerState.DRAINED)
    return any(hb.pod == pod and hb.state in serving for hb in _heartbeats(p))


def _heartbeat_figures(p: Pass) -> None:
    mine = _heartbeats(p)
    running = {x.name for x in p.pods if x.role == Role.ROLLOUT.value and x.active}
    running -= p.leaving
    serving = [hb for hb in mine if hb.role == Role.ROLLOUT.value and hb.pod in running]
    if versions := [hb.weight_version for hb in serving if WorkerState(hb.state).is_ready()]:
        p.status.weight_version = min(versions)
    trainers = [hb for hb in mine if hb.role == Role.TRAINER.value]
    done = [hb.weight_version for hb in trainers if hb.state == WorkerState.DONE]
    if done:  # the final version, whether or not the rollouts got to it before they stopped
        p.status.weight_version = max(done)
    if trainers:
        p.status.step = max(hb.step for hb in trainers)
        rewards = [hb.reward for hb in trainers if hb.reward is not None]
        p.status.reward = round(rewards[0], 4) if rewards else p.status.reward
        held = [hb.held_out for hb in trainers if hb.held_out is not None]
        p.status.held_out = round(held[0], 4) if held else p.status.held_out
        paces = [hb.step_seconds for hb in trainers if hb.step_seconds]
        p.status.step_seconds = round(paces[0], 3) if paces else p.status.step_seconds
    for key, value in flow.group_figures(mine, running).items():
        setattr(p.status, key, value)
    _progress(p)


def _progress(p: Pass) -> None:
    """Progress and ETA of a group with the trainer (`progress`)."""
    policy = p.job.spec.policy(p.group.spec.policy) if p.job else None
    if p.job is None or policy is None or not p.group.spec.trainer:
        return
    budget = p.job.spec.steps_of(policy)
    p.status.progress = progress.progress(p.status.step, budget)
    p.status.eta = progress.eta(
        p.status.step, budget, p.status.step_seconds, completed=p.status.trainer_completed
    )


def _phase_and_ready(p: Pass) -> None:
    """Ready: the trainer trains and the rollouts serve. The phase turns Running once the
    group first serves and stays Running while it scales or replaces a pod; Ready says what
    is degraded meanwhile."""
    if p.idle:
        return  # `_idle` said why, in every condition
    _workers_healthy(p)
    if p.blocked or p.status.phase == Phase.FAILED:
        return
    trainer = find_condition(p.status.conditions, ConditionType.TRAINER_HEALTHY)
    rollouts = find_condition(p.status.conditions, ConditionType.ROLLOUTS_READY)
    rollouts_ok = rollouts is not None and rollouts.status == ConditionStatus.TRUE
    trainer_ok = p.group.spec.trainer is None or (
        trainer is not None and trainer.reason in ("Running", "Completed")
    )
    serving = p.status.ready_replicas > 0 or p.group.spec.rollout.replicas == 0
    started = p.group.status.phase == Phase.RUNNING
    p.status.phase = Phase.RUNNING if started or (trainer_ok and serving) else Phase.PENDING
    ok = trainer_ok and rollouts_ok
    if p.status.last_failure and not ok:
        p.condition(ConditionType.READY, False, "WorkerFailed", p.status.last_failure)
        return
    degraded = [
        c.message for c in (trainer, rollouts) if c is not None and c.status != ConditionStatus.TRUE
    ]
    if not trainer_ok and trainer is not None and trainer.status == ConditionStatus.TRUE:
        degraded.insert(0, trainer.message)
    p.condition(
        ConditionType.READY,
        ok,
        "Ready" if ok else ("Degraded" if started else "NotReady"),
        "the trainer trains and the rollouts serve" if ok else "; ".join(degraded),
    )


def _workers_healthy(p: Pass) -> None:
    """WorkersHealthy: False, quoting the last failed pod, until the group recovers."""
    if p.status.phase == Phase.FAILED:
        return  # set, with its reason, where the group failed
    if p.status.last_failure is None:
        p.condition(
            ConditionType.WORKERS_HEALTHY, True, "Healthy", "no pod of this group failed lately"
        )
    else:
        p.condition(ConditionType.WORKERS_HEALTHY, False, "WorkerFailed", p.status.last_failure)


async def _finish(p: Pass) -> None:
    _heartbeat_figures(p)
    _phase_and_ready(p)
    p.status.observed_generation = p.group.metadata.generation
    await report.publish(
        p.ctx.kube,
        kind="PolicyGroup",
        plural="policygroups",
        meta=p.group.metadata,
        before=p.group.status,
        after=p.status,
        events=p.events,
    )
