"""`plan(job) -> Plan(policy_groups, launches)`: the one place that decides what runs.

Pure: the same job (and groups) always give the same plan, with no clock, randomness or
I/O, so it is unit-tested without a cluster and shared by the operator (which renders
launches as Pods) and `polyrl run` (which renders them as processes).

PolicyGroups come from the job's policies; launches come from the groups, because a group
may have been scaled (`kubectl scale`) or applied by a user since. A group's trainer runs
only in the group the job owns; a frozen policy's group the job owns runs a publisher
instead (`frozen: true`: it puts the model into the Object Store once). A suspended or finished job plans no launches at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from polyrl.api import naming
from polyrl.api.launch import (
    CHECKPOINT_MOUNT,
    CONFIG_ENV,
    POD_NAME_ENV,
    RDZV_PORT,
    TRAINER_DIR_ENV,
    Role,
    WorkerConfig,
    WorkerLaunch,
    trainer_subdir,
)
from polyrl.api.resources import (
    Metadata,
    Phase,
    PolicyGroup,
    PolicyGroupSpec,
    PolicySpec,
    RLJob,
    RLJobSpec,
    Strategy,
    TrainerSpec,
    pvc_parts,
    volume_parts,
)

WORKER_COMMAND = ("polyrl", "worker")
DATA_PATH_PARAMS = ("path", "heldOutPath")  # task params that name data files (`dataset`)
TRAINER_ENTRY = ("-m", "polyrl.workers.trainer")  # what torchrun runs on every rank


@dataclass(frozen=True, slots=True)
class Entrypoints:
    """What the worker image runs: `<worker> rollout|workflow`, and `<worker> trainer
    torchrun ... <trainer>` (checks, then torchrun runs `<trainer>` on every rank).

    The defaults fit the worker image; the operator can override them for other images.
    """

    worker: tuple[str, ...] = WORKER_COMMAND
    trainer: tuple[str, ...] = TRAINER_ENTRY


DEFAULT_ENTRYPOINTS = Entrypoints()


@dataclass(frozen=True, slots=True)
class Plan:
    policy_groups: list[PolicyGroup] = field(default_factory=list)
    launches: list[WorkerLaunch] = field(default_factory=list)

    def workflow(self) -> list[WorkerLaunch]:
        return [launch for launch in self.launches if launch.role == Role.WORKFLOW]


def base_labels(job: str) -> dict[str, str]:
    return {
        naming.L_JOB: job,
        naming.L_MANAGED_BY: naming.MANAGED_BY,
        "app.kubernetes.io/part-of": "polyrl",
    }


def policy_groups(job: RLJob) -> list[PolicyGroup]:
    """The PolicyGroup the job owns for each of its policies (seeded from the job)."""
    return [
        PolicyGroup(
            metadata=Metadata(
                name=naming.policy_group(job.metadata.name, p.name),
                namespace=job.metadata.namespace,
                labels={**base_labels(job.metadata.name), naming.L_POLICY: p.name},
            ),
            spec=PolicyGroupSpec(
                job_ref=job.metadata.name,
                policy=p.name,
                trainer=None if p.frozen else p.trainer,
                frozen=p.frozen,
                rollout=p.rollout,
                image=p.image,
            ),
        )
        for p in job.spec.policies
    ]


def plan(
    job: RLJob,
    *,
    nats_url: str,
    groups: Sequence[PolicyGroup] | None = None,
    entrypoints: Entrypoints = DEFAULT_ENTRYPOINTS,
) -> Plan:
    owned = policy_groups(job)
    if job.spec.suspend or Phase(job.status.phase).is_terminal():
        return Plan(policy_groups=owned)
    launches: list[WorkerLaunch] = []
    for group in groups if groups is not None else owned:
        policy = job.spec.policy(group.spec.policy)
        if policy is None:
            continue
        launches += group_launches(job, group, policy, nats_url=nats_url, entrypoints=entrypoints)
    launches += [
        _workflow(job, i, nats_url, entrypoints) for i in range(job.spec.workflow.replicas)
    ]
    return Plan(policy_groups=owned, launches=launches)


def group_launches(
    job: RLJob,
    group: PolicyGroup,
    policy: PolicySpec,
    *,
    nats_url: str,
    entrypoints: Entrypoints = DEFAULT_ENTRYPOINTS,
) -> list[WorkerLaunch]:
    """A group's trainer launches (if it has a trainer), its publisher (a frozen policy's
    group the job owns) and its rollout launches (none for a policy another policy's pool
    serves: `rollout.servedBy`)."""
    launches = []
    if group.spec.frozen:
        launches.append(_publisher(job, group, policy, nats_url, entrypoints))
    trainer = group.spec.trainer
    if trainer is not None:
        launches += [
            _trainer(job, group, policy, trainer, i, nats_url, entrypoints)
            for i in range(trainer.replicas)
        ]
    if policy.rollout.served_by is not None:  # another policy's pool serves it
        return launches
    template = rollout_template(job, group, policy, nats_url=nats_url, entrypoints=entrypoints)
    launches += [
        template.with_replica(i, naming.rollout_pod(group.metadata.name, i))
        for i in range(group.spec.rollout.replicas)
    ]
    return launches


def _config(
    job: RLJob,
    role: Role,
    nats_url: str,
    *,
    policy: str | None = None,
    group: str | None = None,
    replica: int = 0,
) -> WorkerConfig:
    return WorkerConfig(
        namespace=job.metadata.namespace,
        job=job.metadata.name,
        role=role,
        policy=policy,
        policy_group=group,
        replica=replica,
        nats_url=nats_url,
        spec=_for_workers(job.spec),
    )


def _for_workers(spec: RLJobSpec) -> RLJobSpec:
    """The spec workers get, without `stop.durationSeconds`: only the operator ends a job by
    time, and a pod's spec hash covers its config, so ending a job that way (or extending
    it) would otherwise restart its trainers from their checkpoints first."""
    if spec.stop.duration_seconds is None:
        return spec
    stop = spec.stop.model_copy(update={"duration_seconds": None})
    return spec.model_copy(update={"stop": stop})


def _labels(
    job: RLJob, role: Role, replica: int, group: PolicyGroup | None = None
) -> dict[str, str]:
    labels = {
        **base_labels(job.metadata.name),
        naming.L_ROLE: str(role),
        naming.L_REPLICA: str(replica),
    }
    if group is not None:
        labels |= {naming.L_POLICY: group.spec.policy, naming.L_GROUP: group.metadata.name}
    return labels


def rollout_template(
    job: RLJob,
    group: PolicyGroup,
    policy: PolicySpec,
    *,
    nats_url: str,
    entrypoints: Entrypoints = DEFAULT_ENTRYPOINTS,
) -> WorkerLaunch:
    """Replica 0 of a group's rollout pool; `with_replica` gives the others."""
    name = group.metadata.name
    url = group.spec.nats_url or nats_url
    config = _config(job, Role.ROLLOUT, url, policy=policy.name, group=name)
    rollout = group.spec.rollout
    return WorkerLaunch(
        name=naming.rollout_pod(name, 0),
        role=Role.ROLLOUT,
        policy=policy.name,
        policy_group=name,
        replica=0,
        image=group.spec.image or policy.image or job.spec.image,
        command=[*entrypoints.worker, Role.ROLLOUT.value],
        env={CONFIG_ENV: config.to_env()},
        labels=_labels(job, Role.ROLLOUT, 0, group),
        resources=rollout.resources,
        node_selector=rollout.node_selector,
        tolerations=rollout.tolerations,
        config=config,
    )


def trainer_command(
    group: str, trainer: TrainerSpec, entrypoints: Entrypoints = DEFAULT_ENTRYPOINTS
) -> list[str]:
    """`<worker> trainer torchrun ...`: the worker checks the job's input without torch (in
    seconds: a bad model path or task name fails the pod at once), then becomes torchrun:
    standalone for one node, c10d rendezvous on the headless Service otherwise.

    `$(POLYRL_RDZV_ENDPOINT)` and `$(POLYRL_NODE_RANK)` are filled by whoever renders the
    launch (the operator points them at pod 0 behind `<group>-trainer`).
    """
    base = [
        *entrypoints.worker,
        Role.TRAINER.value,
        "torchrun",
        f"--nproc-per-node={trainer.nproc_per_node}",
    ]
    entry = entrypoints.trainer
    if trainer.replicas == 1:
        return [*base, "--standalone", "--nnodes=1", *entry]
    timeout = trainer.rendezvous_timeout_seconds  # connecting to the store, then joining
    return [
        *base,
        f"--nnodes={trainer.replicas}",
        "--node-rank=$(POLYRL_NODE_RANK)",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=$(POLYRL_RDZV_ENDPOINT)",
        f"--rdzv-id={group}",
        f"--rdzv-conf=join_timeout={timeout},read_timeout={timeout}",
        *entry,
    ]


def _trainer(
    job: RLJob,
    group: PolicyGroup,
    policy: PolicySpec,
    trainer: TrainerSpec,
    replica: int,
    nats_url: str,
    entrypoints: Entrypoints,
) -> WorkerLaunch:
    name = group.metadata.name
    url = group.spec.nats_url or nats_url
    config = _config(job, Role.TRAINER, url, policy=policy.name, group=name, replica=replica)
    env = {
        CONFIG_ENV: config.to_env(),
        "POLYRL_NODE_RANK": str(replica),
        "POLYRL_RDZV_ENDPOINT": f"{naming.trainer_pod(name, 0)}."
        f"{naming.trainer_service(name)}:{RDZV_PORT}",
    }
    claim = None
    # ddp: rank 0 alone saves and resumes; fsdp2: every rank writes and reads its shards.
    if replica == 0 or trainer.strategy == Strategy.FSDP2:
        claim = checkpoint_claim(job, policy)
        env[TRAINER_DIR_ENV] = checkpoint_root(job)
    return WorkerLaunch(
        name=naming.trainer_pod(name, replica),
        role=Role.TRAINER,
        policy=policy.name,
        policy_group=name,
        replica=replica,
        image=group.spec.image or policy.image or job.spec.image,
        command=trainer_command(name, trainer, entrypoints),
        env=env,
        labels=_labels(job, Role.TRAINER, replica, group),
        resources=trainer.resources,
        node_selector=trainer.node_selector,
        tolerations=trainer.tolerations,
        checkpoint_claim=claim,
        model_claims=model_claims(policy),
        data_claims=data_claims(job),
        data_configmaps=data_volumes(job, "configmap"),
        data_secrets=data_volumes(job, "secret"),
        config=config,
    )


def _publisher(
    job: RLJob, group: PolicyGroup, policy: PolicySpec, nats_url: str, entrypoints: Entrypoints
) -> WorkerLaunch:
    """A frozen policy's publisher: it reads the model as a trainer would (so it mounts the
    model's claims) and publishes it once; it keeps no checkpoint."""
    name = group.metadata.name
    url = group.spec.nats_url or nats_url
    config = _config(job, Role.PUBLISHER, url, policy=policy.name, group=name)
    return WorkerLaunch(
        name=naming.publisher_pod(name),
        role=Role.PUBLISHER,
        policy=policy.name,
        policy_group=name,
        image=group.spec.image or policy.image or job.spec.image,
        command=[*entrypoints.worker, Role.PUBLISHER.value],
        env={CONFIG_ENV: config.to_env()},
        labels=_labels(job, Role.PUBLISHER, 0, group),
        resources=policy.trainer.resources,
        node_selector=policy.trainer.node_selector,
        tolerations=policy.trainer.tolerations,
        model_claims=model_claims(policy),
        config=config,
    )


def model_claims(policy: PolicySpec) -> list[str]:
    """The claims `policy`'s model and tokenizer read from (`pvc://<claim>/<path>`)."""
    paths = [policy.model.path, policy.model.tokenizer or ""]
    return sorted({pvc_parts(p)[0] for p in paths if p.startswith("pvc://")})


def data_claims(job: RLJob) -> list[str]:
    """The claims the task's data files read from (`path`, `heldOutPath` as pvc://...): the
    workflow runners sample from them, the trainers evaluate on their held-out split."""
    return data_volumes(job, "pvc")


def data_volumes(job: RLJob, scheme: str) -> list[str]:
    """The volumes of `scheme` (pvc, configmap, secret) the task's data files name."""
    names = set()
    for key in DATA_PATH_PARAMS:
        path = job.spec.workflow.task.params.get(key)
        if isinstance(path, str) and path.startswith(f"{scheme}://"):
            with contextlib.suppress(ValueError):  # the task's own check names it, at start
                names.add(volume_parts(path, scheme, what="dataset")[0])
    return sorted(names)


def checkpoint_claim(job: RLJob, policy: PolicySpec) -> str:
    """The PersistentVolumeClaim holding `policy`'s checkpoints: the user's, or the one the
    operator creates."""
    spec = policy.trainer.checkpoint
    return spec.claim_name or naming.checkpoint_claim(job.metadata.name, policy.name)


def checkpoint_root(job: RLJob) -> str:
    """The trainer's directory in its claim: keyed by the job's UID, so a new job that takes
    an old job's name (and claim) never resumes the old one's checkpoint."""
    return f"{CHECKPOINT_MOUNT}/{job.metadata.uid or 'no-uid'}"


def checkpoint_output(job: RLJob, policy: PolicySpec) -> str:
    """Where `policy`'s checkpoint is once the trainer saved it (pvc://<claim>/<path>)."""
    meta = job.metadata
    subdir = trainer_subdir(meta.namespace, meta.name, policy.name)
    return f"pvc://{checkpoint_claim(job, policy)}/{meta.uid or 'no-uid'}/{subdir}/checkpoint"


def _workflow(job: RLJob, replica: int, nats_url: str, entrypoints: Entrypoints) -> WorkerLaunch:
    config = _config(job, Role.WORKFLOW, nats_url, replica=replica)
    return WorkerLaunch(
        name=naming.workflow_pod(job.metadata.name, replica),
        role=Role.WORKFLOW,
        replica=replica,
        image=job.spec.image,
        command=[*entrypoints.worker, Role.WORKFLOW.value],
        env={CONFIG_ENV: config.to_env()},
        labels=_labels(job, Role.WORKFLOW, replica),
        data_claims=data_claims(job),
        data_configmaps=data_volumes(job, "configmap"),
        data_secrets=data_volumes(job, "secret"),
        config=config,
    )


__all__ = [
    "POD_NAME_ENV",
    "Plan",
    "group_launches",
    "plan",
    "policy_groups",
    "rollout_template",
    "trainer_command",
]
