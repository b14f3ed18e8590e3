"""Every name a job uses, in Kubernetes and in NATS, decided in one place.

Names are deterministic functions of (namespace, job, policy, replica), so a restarted
operator finds what it made before instead of making it twice, and a worker in another
region derives the same subjects from the same config. Kubernetes children:

    PolicyGroup        <job>-<policy>                (user-applied groups: any name)
    trainer pods       <group>-trainer-<i>           headless Service <group>-trainer
    rollout pods       <group>-rollout-<i>           i < 1000
    workflow runners   <job>-workflow-<i>
    checkpoint claims  <job>-<policy>-checkpoints    (unless the policy names its own)

NATS, prefix `af.<namespace>.<job>` (stream and bucket names cannot contain dots, so they
use dashes): per policy a work-queue stream of generation requests, a trajectory stream
(message-id de-duplication), a weight-announcement stream and an Object Store bucket of
weight objects; per job a KV bucket of heartbeats and a dead-letter stream.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from polyrl.api.base import ApiModel

LABEL_PREFIX = "polyrl.dev"
MANAGED_BY = "polyrl-operator"

L_JOB = f"{LABEL_PREFIX}/job"
L_POLICY = f"{LABEL_PREFIX}/policy"
L_GROUP = f"{LABEL_PREFIX}/policy-group"
L_ROLE = f"{LABEL_PREFIX}/role"
L_REPLICA = f"{LABEL_PREFIX}/replica"
L_DRAINING = f"{LABEL_PREFIX}/draining"
L_MANAGED_BY = "app.kubernetes.io/managed-by"
A_DRAIN_STARTED = f"{LABEL_PREFIX}/drain-started"
A_SPEC_HASH = f"{LABEL_PREFIX}/spec-hash"
# On an RLJob without spec.nats.url: the operator's NATS when the job first ran. The job
# stays on it when the operator's default changes (its streams, buckets and pods are there).
A_NATS_URL = f"{LABEL_PREFIX}/nats-url"


def policy_group(job: str, policy: str) -> str:
    return f"{job}-{policy}"


def trainer_pod(group: str, replica: int) -> str:
    return f"{group}-trainer-{replica}"


def trainer_service(group: str) -> str:
    return f"{group}-trainer"


def publisher_pod(group: str) -> str:
    """A frozen policy's publisher (`frozen: true`): one pod, in place of the trainer."""
    return f"{group}-publisher"


def rollout_pod(group: str, replica: int) -> str:
    return f"{group}-rollout-{replica}"


def workflow_pod(job: str, replica: int) -> str:
    return f"{job}-workflow-{replica}"


def checkpoint_claim(job: str, policy: str) -> str:
    return f"{job}-{policy}-checkpoints"


def active_rollout_selector(group: str) -> str:
    """Active (not draining) rollout pods of a group: the scale subresource's selector."""
    return f"{L_GROUP}={group},{L_ROLE}=rollout,!{L_DRAINING}"


class JobNames(ApiModel):
    """The NATS subjects, streams and buckets of one job."""

    namespace: str = Field(description="Kubernetes namespace of the job (`local` for polyrl run).")
    job: str = Field(description="RLJob name.")

    @property
    def prefix(self) -> str:
        return f"af.{self.namespace}.{self.job}"

    @property
    def _dash(self) -> str:
        return f"af-{self.namespace}-{self.job}"

    def requests_subject(self, policy: str) -> str:
        return f"{self.prefix}.{policy}.requests"

    def eval_replies_subject(self, policy: str) -> str:
        """Where rollout workers answer a trainer's held-out evaluation requests
        (`trainer.evalOn: rollout`): apart from the workflow runners' replies."""
        return f"{self.prefix}.{policy}.eval-replies"

    def requests_stream(self, policy: str) -> str:
        return f"{self._dash}-{policy}-requests"

    rollout_consumer: ClassVar[str] = "rollout"

    def trajectories_subject(self, policy: str) -> str:
        return f"{self.prefix}.{policy}.trajectories"

    def trajectories_stream(self, policy: str) -> str:
        return f"{self._dash}-{policy}-trajectories"

    trainer_consumer: ClassVar[str] = "trainer"

    def weights_subject(self, policy: str) -> str:
        return f"{self.prefix}.{policy}.weights"

    def weights_stream(self, policy: str) -> str:
        return f"{self._dash}-{policy}-weights"

    def weights_bucket(self, policy: str) -> str:
        return f"{self._dash}-{policy}-weights"

    def drain_subject(self, policy: str, pod: str) -> str:
        return f"{self.prefix}.{policy}.control.drain.{pod}"

    def drained_subject(self, policy: str, pod: str) -> str:
        return f"{self.prefix}.{policy}.control.drained.{pod}"

    @property
    def drained_wildcard(self) -> str:
        return f"{self.prefix}.*.control.drained.*"

    @property
    def heartbeats_bucket(self) -> str:
        return f"{self._dash}-heartbeats"

    @staticmethod
    def heartbeat_key(policy: str | None, role: str, pod: str) -> str:
        return f"{policy or '_'}.{role}.{pod}"

    @property
    def dead_letter_subject(self) -> str:
        return f"{self.prefix}.dlq"

    @property
    def dead_letter_stream(self) -> str:
        return f"{self._dash}-dlq"
