"""Who may touch what in NATS: the access matrix of a job's roles, declared once.

Every worker connects with a NATS user of its own job and role (and policy, for trainers and
rollout workers); the user's JWT carries exactly the subjects `grant` derives here, and
nats-server enforces them (`polyrl.api.natsjwt` signs them, docs/security.md has the model).
Streams and buckets are created by the operator (or `polyrl run`), never by a worker, so no
role may create, update or delete a stream, except a trainer bounding and pruning its own
policy's weights bucket.

JetStream is reached through subjects, so a read grant on a stream is its API subjects:
stream info, message get (direct or not), creating, reading and deleting consumers, the
consumers' next-message requests, acks and flow-control replies. Replies come back on an
inbox prefix of the worker's own (`inbox_prefix`), so one job's pull deliveries cannot be
read by another job's workers.

| role | publishes | reads |
|---|---|---|
| rollout (policy p) | responses to the runners' reply subjects; drained notices; its heartbeat; dead letters | p's requests (work queue); p's announcements and weights; its drain subject; the same for each policy p's pool serves (`rollout.servedBy: p`) |
| trainer (policy p) | p's announcements; p's weights bucket (put, prune, bound); its heartbeat; dead letters | p's trajectories; the job's heartbeats; every weights bucket of the job (bundles, handoffs) |
| publisher (frozen policy p) | p's announcements; p's weights bucket (put only); its heartbeat; dead letters | p's announcements and weights (whether version 0 is there already) |
| workflow runner | every policy's requests and trajectories; its heartbeat; dead letters | replies to it; the job's heartbeats; every policy's announcements, weights buckets and trajectory consumer |
| admin (operator, `polyrl run`) | everything in the account | everything |
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import Field

from polyrl.api.base import ApiModel
from polyrl.api.launch import Role
from polyrl.api.naming import JobNames

API = "$JS.API"


class Grant(ApiModel):
    """One NATS user's permissions: subjects it may publish to and subscribe to."""

    publish: list[str] = Field(description="Subjects (wildcards allowed) the user may publish to.")
    subscribe: list[str] = Field(description="Subjects the user may subscribe to.")


def inbox_prefix(names: JobNames, role: Role, policy: str | None) -> str:
    """Where this worker's replies arrive (nats-py's `inbox_prefix`): private to its role."""
    return f"_i.{names.namespace}.{names.job}.{role}.{policy or '_'}"


def creds_key(role: Role, policy: str | None) -> str:
    """Where a role's creds are kept (a Secret's key): `workflow.creds`, `trainer-<p>.creds`."""
    return f"{role}.creds" if policy is None else f"{role}-{policy}.creds"


def read_stream(stream: str) -> list[str]:
    """The API subjects that read a stream through consumers and message gets."""
    return [
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.STREAM.MSG.GET.{stream}",
        f"{API}.DIRECT.GET.{stream}",
        f"{API}.DIRECT.GET.{stream}.>",
        f"{API}.CONSUMER.*.{stream}",  # create (ephemeral), list, names
        f"{API}.CONSUMER.*.{stream}.>",  # create (named), info, delete
        f"{API}.CONSUMER.DURABLE.CREATE.{stream}.>",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def write_stream(stream: str, subjects: Iterable[str]) -> list[str]:
    """Publishing into a stream: its subjects, and its info (nats-py looks before it binds)."""
    return [f"{API}.STREAM.INFO.{stream}", *subjects]


def _kv(bucket: str) -> str:
    return f"KV_{bucket}"


def _obj(bucket: str) -> str:
    return f"OBJ_{bucket}"


def _common(names: JobNames, role: Role, policy: str | None) -> Grant:
    """What every worker does: beat, dead-letter, and receive its replies."""
    bucket = names.heartbeats_bucket
    key = names.heartbeat_key(policy, role, "*")
    return Grant(
        publish=[
            *write_stream(_kv(bucket), [f"$KV.{bucket}.{key}"]),
            *write_stream(names.dead_letter_stream, [names.dead_letter_subject]),
        ],
        subscribe=[f"{inbox_prefix(names, role, policy)}.>"],
    )


def _rollout(names: JobNames, policy: str, served: Sequence[str]) -> Grant:
    publish = [f"{names.prefix}.replies.*", names.drained_subject(policy, "*")]
    subscribe = [names.drain_subject(policy, "*")]
    for p in (policy, *served):  # a shared pool serves `served` beside its own policy
        publish += [
            names.eval_replies_subject(p),
            *read_stream(names.requests_stream(p)),
            *read_stream(names.weights_stream(p)),
            *read_stream(_obj(names.weights_bucket(p))),
        ]
        subscribe.append(names.weights_subject(p))
    return Grant(publish=publish, subscribe=subscribe)


def _trainer(names: JobNames, policy: str, policies: Sequence[str]) -> Grant:
    own = _obj(names.weights_bucket(policy))
    return Grant(
        publish=[
            *write_stream(names.weights_stream(policy), [names.weights_subject(policy)]),
            *read_stream(names.weights_stream(policy)),
            f"$O.{names.weights_bucket(policy)}.>",
            f"{API}.STREAM.UPDATE.{own}",  # its message limit (`natsconfig.bound_weights`)
            f"{API}.STREAM.PURGE.{own}",  # retention deletes old versions
            *read_stream(names.trajectories_stream(policy)),
            *read_stream(_kv(names.heartbeats_bucket)),
            *(s for p in policies for s in read_stream(_obj(names.weights_bucket(p)))),
            # Held-out evaluation through the policy's own pool (`trainer.evalOn: rollout`).
            *write_stream(names.requests_stream(policy), [names.requests_subject(policy)]),
        ],
        subscribe=[names.eval_replies_subject(policy)],
    )


def _publisher(names: JobNames, policy: str) -> Grant:
    """A frozen policy's publisher puts the bundle and version 0 into its bucket once, and
    announces it; unlike a trainer it neither prunes nor bounds the bucket (one version is
    all there is), and reads no trajectories, heartbeats or other policies' buckets."""
    return Grant(
        publish=[
            *write_stream(names.weights_stream(policy), [names.weights_subject(policy)]),
            *read_stream(names.weights_stream(policy)),
            f"$O.{names.weights_bucket(policy)}.>",
            *read_stream(_obj(names.weights_bucket(policy))),
        ],
        subscribe=[],
    )


def _workflow(names: JobNames, policies: Sequence[str]) -> Grant:
    publish = [f"{API}.STREAM.INFO.{names.dead_letter_stream}"]
    subscribe = [f"{names.prefix}.replies.*"]
    for p in policies:
        publish += [
            *write_stream(names.requests_stream(p), [names.requests_subject(p)]),
            *write_stream(names.trajectories_stream(p), [names.trajectories_subject(p)]),
            f"{API}.CONSUMER.INFO.{names.trajectories_stream(p)}.{JobNames.trainer_consumer}",
            *read_stream(names.weights_stream(p)),
            *read_stream(_obj(names.weights_bucket(p))),
        ]
        subscribe.append(names.weights_subject(p))
    publish += read_stream(_kv(names.heartbeats_bucket))
    return Grant(publish=publish, subscribe=subscribe)


def grant(
    names: JobNames,
    role: Role,
    policy: str | None,
    policies: Sequence[str],
    *,
    served: Sequence[str] = (),
) -> Grant:
    """The permissions of `role` (for `policy`, where the role has one) in the job `names`
    whose policies are `policies`; a rollout pool's also cover the other policies it serves
    (`served`: those with `rollout.servedBy: policy`)."""
    if role in (Role.ROLLOUT, Role.TRAINER, Role.PUBLISHER) and policy not in policies:
        raise ValueError(
            f"a {role} needs one of the job's policies {list(policies)}, not {policy!r}"
        )
    if strangers := [p for p in served if p not in policies or p == policy]:
        raise ValueError(f"a pool of {policy!r} cannot serve {strangers}")
    match role:
        case Role.ROLLOUT:
            own = _rollout(names, str(policy), served)
        case Role.TRAINER:
            own = _trainer(names, str(policy), policies)
        case Role.WORKFLOW:
            own = _workflow(names, policies)
        case Role.PUBLISHER:
            own = _publisher(names, str(policy))
    common = _common(names, role, policy if role is not Role.WORKFLOW else None)
    return Grant(
        publish=_unique(common.publish + own.publish),
        subscribe=_unique(common.subscribe + own.subscribe),
    )


ADMIN = Grant(publish=[">"], subscribe=[">"])


def _unique(subjects: list[str]) -> list[str]:
    return list(dict.fromkeys(subjects))
