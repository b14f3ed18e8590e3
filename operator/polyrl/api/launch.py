"""`WorkerLaunch`: what runs, described once, rendered as a Pod or as a local process.

A worker takes every input from its environment: `POLYRL_WORKER_CONFIG` holds one JSON
document (`WorkerConfig`) with the job's spec, the worker's role, policy and replica, and
the NATS URL; credentials come separately from a Secret (never inside the document). No
fixed ports (0 means pick a free one) and no shared volumes: rollout workers fetch model,
tokenizer and weights from the job's Object Store. The one volume is a trainer's own
checkpoint claim, mounted in its first pod only.
"""

from __future__ import annotations

import enum
import json

from pydantic import Field

from polyrl.api.base import ApiModel, Resources, Toleration
from polyrl.api.resources import RLJobSpec

CONFIG_ENV = "POLYRL_WORKER_CONFIG"
POD_NAME_ENV = "POLYRL_POD_NAME"
# A NATS creds file's text (a user JWT and its seed): the worker's own user, whose
# permissions `polyrl.api.access` grants; a worker with one never creates streams.
NATS_CREDS_ENV = "POLYRL_NATS_CREDS"
# The same as a file's path, which the worker's NATS connection reads on every (re)connect:
# a pod's own key of `<job>-nats-users`, mounted where the kubelet replaces it
# when the operator renews the users (`polyrl.operator.natsusers`).
NATS_CREDS_FILE_ENV = "POLYRL_NATS_CREDS_FILE"
NATS_USER_MOUNT = "/etc/polyrl/nats-user"
NATS_USER_FILE = "user.creds"
TRAINER_DIR_ENV = "POLYRL_TRAINER_DIR"  # where a trainer keeps models and checkpoints
# Where converted models (GGUF files, dequantized) are kept across runs; default the
# trainer's directory. `polyrl run` points it at the user's cache.
MODEL_CACHE_ENV = "POLYRL_MODEL_CACHE"
CHECKPOINT_MOUNT = "/var/lib/polyrl"  # the checkpoint claim, in a trainer's first pod
RDZV_PORT = 29400
# `pvc://<claim>/<path>` models: the claim is mounted read-only in the trainer's pods here.
PVC_ROOT = "/mnt/polyrl/pvc"
PVC_ROOT_ENV = "POLYRL_PVC_ROOT"
# `configmap://<name>/<key>` and `secret://<name>/<key>` data files: mounted read-only here.
DATA_ROOTS = {"configmap": "/mnt/polyrl/configmap", "secret": "/mnt/polyrl/secret"}
DATA_ROOT_ENV = "POLYRL_DATA_ROOT"  # tests: <root>/configmap/<name>, <root>/secret/<name>
# How a worker's exit status tells the operator (and `polyrl run`) what to do next.
EXIT_INVALID_INPUT = 2  # the job's spec or data cannot work: running it again cannot help
EXIT_UNAVAILABLE = 69  # something it needs (NATS) is not there yet: retry with backoff
TERMINATION_LOG_ENV = "POLYRL_TERMINATION_LOG"  # where a worker writes why it stopped
TERMINATION_LOG = "/dev/termination-log"  # the kubelet's default terminationMessagePath
# How a termination message starts when the worker refused its input: torchrun exits 1
# whatever its ranks' status, so the message, not the code, carries a trainer's verdict.
INVALID_INPUT_PREFIX = "invalid input: "


def trainer_subdir(namespace: str, job: str, policy: str) -> str:
    """A trainer's directory under its root (TRAINER_DIR_ENV): models, then `checkpoint/`."""
    return f"{namespace}/{job}/{policy}"


class Role(enum.StrEnum):
    TRAINER = "trainer"
    ROLLOUT = "rollout"
    WORKFLOW = "workflow"
    PUBLISHER = "publisher"  # a frozen policy's: puts its model into the Object Store once


class WorkerConfig(ApiModel):
    """The single config document a worker reads (env POLYRL_WORKER_CONFIG)."""

    namespace: str = Field(description="Namespace of the job (`local` under polyrl run).")
    job: str = Field(description="RLJob name.")
    role: Role = Field(description="trainer, rollout, workflow or publisher.")
    policy: str | None = Field(
        None, description="Policy trained or served (none for workflow runners)."
    )
    policy_group: str | None = Field(None, description="The PolicyGroup the worker belongs to.")
    replica: int = Field(0, ge=0, description="Replica index within its role and group.")
    nats_url: str = Field(description="NATS to connect to.")
    spec: RLJobSpec = Field(
        description="The whole job spec, so every worker sees the same settings."
    )

    def to_env(self) -> str:
        return json.dumps(self.to_api(), separators=(",", ":"))


class WorkerLaunch(ApiModel):
    """One worker to run: a Pod under the operator, a process under `polyrl run`."""

    name: str = Field(description="Pod or process name (deterministic).")
    role: Role
    policy: str | None = None
    policy_group: str | None = None
    replica: int = Field(0, ge=0)
    image: str
    command: list[str] = Field(description="argv; `$(VAR)` refers to env, as in a Pod.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Plain env, including the config document."
    )
    labels: dict[str, str] = Field(default_factory=dict)
    resources: Resources | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    checkpoint_claim: str | None = Field(
        None,
        description="PersistentVolumeClaim mounted at CHECKPOINT_MOUNT (a trainer's first pod; a local run ignores it).",
    )
    model_claims: list[str] = Field(
        default_factory=list,
        description="Claims a `pvc://` model reads from, mounted read-only at PVC_ROOT/<claim> (trainer pods; a local run ignores them).",
    )
    data_claims: list[str] = Field(
        default_factory=list,
        description="Claims a `pvc://` data file of the task reads from, mounted read-only at PVC_ROOT/<claim> (workflow and trainer pods; a local run ignores them).",
    )
    data_configmaps: list[str] = Field(
        default_factory=list,
        description="ConfigMaps a `configmap://` data file reads from, mounted read-only at DATA_ROOTS['configmap']/<name> (workflow and trainer pods).",
    )
    data_secrets: list[str] = Field(
        default_factory=list,
        description="Secrets a `secret://` data file reads from, mounted read-only at DATA_ROOTS['secret']/<name> (workflow and trainer pods).",
    )
    config: WorkerConfig

    def with_replica(self, replica: int, name: str) -> WorkerLaunch:
        """The same launch for another replica index (rollout pools fill free indices)."""
        config = self.config.model_copy(update={"replica": replica})
        labels = {**self.labels, "polyrl.dev/replica": str(replica)}
        env = {**self.env, CONFIG_ENV: config.to_env()}
        return self.model_copy(
            update={
                "replica": replica,
                "name": name,
                "config": config,
                "labels": labels,
                "env": env,
            }
        )
