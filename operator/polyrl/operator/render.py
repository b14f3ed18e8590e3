"""Rendering plan output as Kubernetes objects: Pods, the trainer Service, PolicyGroups,
checkpoint claims.

Pods satisfy Pod Security `restricted` (non-root, no privilege escalation, all capabilities
dropped, RuntimeDefault seccomp, read-only root with a writable /tmp; trainers also get a
memory-backed /dev/shm), run with
`restartPolicy: Never` (the operator replaces them, with backoff), never mount a service
account token (workers talk only to NATS), and carry a hash of their spec so a changed image
or resources rolls out. A pod is Ready once its worker does its job (`READINESS_PROBE`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from polyrl.api import access, naming, natstls, queueing
from polyrl.api.base import API_VERSION
from polyrl.api.launch import (
    CHECKPOINT_MOUNT,
    DATA_ROOTS,
    NATS_CREDS_ENV,
    NATS_CREDS_FILE_ENV,
    NATS_USER_FILE,
    NATS_USER_MOUNT,
    POD_NAME_ENV,
    PVC_ROOT,
    RDZV_PORT,
    Role,
    WorkerLaunch,
)
from polyrl.api.resources import PolicyGroup, PolicySpec, RLJob, Strategy

RUN_AS = 65532
NATS_VOLUME = "nats-credentials"
USER_VOLUME = "nats-user"
# Every worker serves Prometheus metrics here (polyrl.workers.runtime.prometheus).
METRICS_PORT, METRICS_PORT_ENV = 9400, "POLYRL_METRICS_PORT"
# Ready means doing its job, said in a heartbeat (a rollout serves the current weights, a
# trainer trains, a runner runs episodes): the worker answers on its metrics port. Probed
# every 2 s, so a scale-up is Ready within 2 s of serving; two misses in a row take a
# pod that drains or hangs out of Ready.
READINESS_PROBE: dict[str, Any] = {
    "httpGet": {"path": "/ready", "port": "metrics"},
    "periodSeconds": 2,
    "timeoutSeconds": 5,
    "failureThreshold": 2,
}


def owner_ref(kind: str, name: str, uid: str, *, api_version: str = API_VERSION) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _env(
    launch: WorkerLaunch, nats_secret: str | None, nats_users: str | None
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(launch.env.items())]
    env += [
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "POLYRL_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": "HOME", "value": "/tmp"},
        {"name": METRICS_PORT_ENV, "value": str(METRICS_PORT)},
    ]
    if nats_secret:
        env.append({"name": natstls.TLS_DIR_ENV, "value": natstls.TLS_MOUNT})
    if nats_users:  # the pod's own user, a file the kubelet renews (`user_volume`)
        env.append({"name": NATS_CREDS_FILE_ENV, "value": f"{NATS_USER_MOUNT}/{NATS_USER_FILE}"})
    elif nats_secret:
        for var, key in (("POLYRL_NATS_TOKEN", "token"), (NATS_CREDS_ENV, "creds")):
            env.append(
                {
                    "name": var,
                    "valueFrom": {
                        "secretKeyRef": {"name": nats_secret, "key": key, "optional": True}
                    },
                }
            )
    return env


def user_volume(launch: WorkerLaunch, nats_users: str) -> dict[str, Any]:
    """The pod's own key of the job's users Secret (signed for its role and policy), and no
    other. A whole-volume mount, not a `subPath`: the kubelet replaces its file when the
    operator renews the users, and the worker reads it again when it reconnects."""
    item = {"key": access.creds_key(launch.role, launch.policy), "path": NATS_USER_FILE}
    secret = {"secretName": nats_users, "items": [item], "defaultMode": 0o440}
    return {"name": USER_VOLUME, "secret": secret}


def _claim_volumes(launch: WorkerLaunch) -> list[tuple[str, str]]:
    """(volume, claim) for each claim mounted read-only: the model's, then the data's not
    already among them."""
    data = [c for c in launch.data_claims if c not in launch.model_claims]
    return [(f"model-{i}", c) for i, c in enumerate(launch.model_claims)] + [
        (f"data-{i}", c) for i, c in enumerate(data)
    ]


def _data_volumes(launch: WorkerLaunch) -> list[tuple[str, str, str]]:
    """(volume, kind, name) for each ConfigMap and Secret a data file names."""
    return [(f"data-cm-{i}", "configmap", n) for i, n in enumerate(launch.data_configmaps)] + [
        (f"data-secret-{i}", "secret", n) for i, n in enumerate(launch.data_secrets)
    ]


def _container(
    launch: WorkerLaunch, nats_secret: str | None, nats_users: str | None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": str(launch.role),
        "image": launch.image,
        "imagePullPolicy": "IfNotPresent",
        "command": launch.command,
        "env": _env(launch, nats_secret, nats_users),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        # Workers write why they stop to /dev/termination-log; a crash without a word
        # leaves the end of its log there instead. The operator quotes it in conditions.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if launch.resources is not None:
        container["resources"] = launch.resources.to_api()
    container["ports"] = [{"name": "metrics", "containerPort": METRICS_PORT}]
    container["readinessProbe"] = READINESS_PROBE
    if launch.role == Role.TRAINER:
        container["ports"].append({"name": "rdzv", "containerPort": RDZV_PORT})
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    if launch.checkpoint_claim:
        container["volumeMounts"].append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
    for volume, claim in _claim_volumes(launch):
        mount = {"name": volume, "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": True}
        container["volumeMounts"].append(mount)
    for volume, kind, name in _data_volumes(launch):
        mount = {"name": volume, "mountPath": f"{DATA_ROOTS[kind]}/{name}", "readOnly": True}
        container["volumeMounts"].append(mount)
    if nats_secret:
        mount = {"name": NATS_VOLUME, "mountPath": natstls.TLS_MOUNT, "readOnly": True}
        container["volumeMounts"].append(mount)
    if nats_users:
        mount = {"name": USER_VOLUME, "mountPath": NATS_USER_MOUNT, "readOnly": True}
        container["volumeMounts"].append(mount)
    return container


def pod_spec(
    launch: WorkerLaunch,
    *,
    nats_secret: str | None = None,
    nats_users: str | None = None,
    grace_seconds: int = 30,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(launch, nats_secret, nats_users)],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if nats_secret:  # its ca.crt, tls.crt and tls.key, where the worker reads TLS from
        secret = {"secretName": nats_secret, "optional": True, "defaultMode": 0o440}
        spec["volumes"].append({"name": NATS_VOLUME, "secret": secret})
    if nats_users:
        spec["volumes"].append(user_volume(launch, nats_users))
    if launch.role == Role.TRAINER:
        # The trainer's delta encoder reads snapshots from shared memory (two bf16 copies of the
        # model), and NCCL uses it too; a container's own /dev/shm is 64 MiB. Memory-backed, it
        # counts against the pod's memory limit.
        spec["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    if launch.checkpoint_claim:
        claim = {"claimName": launch.checkpoint_claim}
        spec["volumes"].append({"name": "checkpoints", "persistentVolumeClaim": claim})
    for volume, name in _claim_volumes(launch):
        claim_ref: dict[str, Any] = {"claimName": name, "readOnly": True}
        spec["volumes"].append({"name": volume, "persistentVolumeClaim": claim_ref})
    for volume, kind, name in _data_volumes(launch):
        # Read by the pod's group (fsGroup), nobody else.
        if kind == "configmap":
            source: dict[str, Any] = {"configMap": {"name": name, "defaultMode": 0o440}}
        else:
            source = {"secret": {"secretName": name, "defaultMode": 0o440}}
        spec["volumes"].append({"name": volume, **source})
    if launch.node_selector:
        spec["nodeSelector"] = dict(launch.node_selector)
    if launch.tolerations:
        spec["tolerations"] = [t.to_api() for t in launch.tolerations]
    if launch.role == Role.TRAINER and launch.policy_group:
        spec["hostname"] = launch.name
        spec["subdomain"] = naming.trainer_service(launch.policy_group)
    return spec


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def pod(
    launch: WorkerLaunch,
    *,
    namespace: str,
    owner: dict[str, Any],
    nats_secret: str | None = None,
    nats_users: str | None = None,
    grace_seconds: int = 30,
    job: RLJob | None = None,
) -> dict[str, Any]:
    """The Pod of `launch`: TLS files (and a token or creds) from `nats_secret`, or, where
    the job has signed users, its own user's creds from `nats_users`. A queued `job`'s pods
    carry what puts them in Kueue's hands (`polyrl.api.queueing`)."""
    labels, annotations = queueing.pod_metadata(job, launch) if job else ({}, {})
    if job is not None:
        launch = queueing.with_default_requests(job, launch)
    spec = pod_spec(
        launch, nats_secret=nats_secret, nats_users=nats_users, grace_seconds=grace_seconds
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": launch.name,
            "namespace": namespace,
            "labels": {**launch.labels, **labels},
            "annotations": {naming.A_SPEC_HASH: spec_hash(spec), **annotations},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def checkpoint_claim(
    job: RLJob, policy: PolicySpec, *, owner: dict[str, Any] | None
) -> dict[str, Any]:
    """The PersistentVolumeClaim the operator makes for `policy`'s checkpoints; owned by the
    job (deleted with it) only under `whenDeleted: Delete`."""
    spec = policy.trainer.checkpoint
    meta: dict[str, Any] = {
        "name": naming.checkpoint_claim(job.metadata.name, policy.name),
        "namespace": job.metadata.namespace,
        "labels": {
            naming.L_JOB: job.metadata.name,
            naming.L_POLICY: policy.name,
            naming.L_MANAGED_BY: naming.MANAGED_BY,
        },
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": {
            "accessModes": [_checkpoint_access(policy)],
            "resources": {"requests": {"storage": str(spec.size)}},
        },
    }
    if spec.storage_class_name:
        body["spec"]["storageClassName"] = spec.storage_class_name
    return body


def _checkpoint_access(policy: PolicySpec) -> str:
    """Several trainer pods of a sharded policy each write their shards to the claim."""
    trainer = policy.trainer
    shared = trainer.strategy == Strategy.FSDP2 and trainer.replicas > 1
    return "ReadWriteMany" if shared else "ReadWriteOnce"


def trainer_service(group: PolicyGroup, *, owner: dict[str, Any]) -> dict[str, Any]:
    """Headless Service giving trainer pods stable DNS names for c10d rendezvous."""
    name = group.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": naming.trainer_service(name),
            "namespace": group.metadata.namespace,
            "labels": {naming.L_GROUP: name, naming.L_MANAGED_BY: naming.MANAGED_BY},
            "ownerReferences": [owner],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {naming.L_GROUP: name, naming.L_ROLE: Role.TRAINER.value},
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}],
        },
    }


def policy_group(group: PolicyGroup, *, owner: dict[str, Any]) -> dict[str, Any]:
    body = group.to_api()
    body.pop("status", None)
    body["metadata"]["ownerReferences"] = [owner]
    return body
