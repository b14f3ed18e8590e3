"""The operator's own configuration, read once from its environment (the Helm chart sets it)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from polyrl.api.plan import DEFAULT_ENTRYPOINTS, Entrypoints

TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    nats_url: str = "nats://nats.nats.svc:4222"
    """NATS for jobs that name none (POLYRL_NATS_URL)."""
    nats_credentials_secret: str | None = None
    """Secret (in the operator's namespace) with the default NATS credentials."""
    nats_signing_secret: str | None = None
    """Secret (in the operator's namespace) with the NATS account's public key (`account`)
    and one of its signing keys' seed (`seed`): with it, every job's pods get users of
    their own (`polyrl.operator.natsusers`) and the operator signs its own (POLYRL_NATS_SIGNING_SECRET)."""
    nats_insecure: bool = False
    """Run jobs without per-role users (POLYRL_NATS_INSECURE, chart nats.insecure): their
    pods share the operator's credentials, or none, and every pod that reaches NATS can read
    and write every job's data. An explicit opt-in: without it and without a signing Secret
    the operator refuses to start (`problems`)."""
    nats_user_ttl: float = 24 * 3600.0
    """Seconds a job's signed users are valid (POLYRL_NATS_USER_TTL): the operator re-signs
    them while the job lives once less than half is left, so a copy of a deleted job's creds
    works at most this long. Half of it must cover the kubelet's Secret refresh (about a
    minute) and a resync (`status_interval`)."""
    namespace: str = "polyrl-system"
    """Where the operator runs (POLYRL_NAMESPACE)."""
    entrypoints: Entrypoints = DEFAULT_ENTRYPOINTS
    """What worker pods run: POLYRL_WORKER_COMMAND (default `polyrl worker`) and
    POLYRL_TRAINER_ENTRY (what torchrun runs, default `-m polyrl.workers.trainer`)."""
    default_image: str | None = None
    """Overrides the jobs' default worker image (POLYRL_DEFAULT_WORKER_IMAGE)."""
    status_interval: float = 30.0
    """Seconds between resyncs of an object nothing happened to (a safety net: pod, group,
    job events and worker heartbeats wake its loop at once)."""
    status_progress_interval: float = 5.0
    """Least seconds between two status updates of a PolicyGroup made only for its workers'
    progress (step, weight version, reward), however fast a trainer steps
    (POLYRL_STATUS_PROGRESS_INTERVAL); other changes show at once."""
    nats_timeout: float = 5.0
    """Bound on one NATS operation (connect, create, delete)."""
    cleanup_timeout: float = 15.0
    """Bound on removing a deleted job's streams, so a delete never hangs."""
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorSettings:
        env = dict(os.environ if env is None else env)
        d = cls()
        return cls(
            nats_url=env.get("POLYRL_NATS_URL", d.nats_url),
            nats_credentials_secret=env.get("POLYRL_NATS_CREDENTIALS_SECRET") or None,
            nats_signing_secret=env.get("POLYRL_NATS_SIGNING_SECRET") or None,
            nats_insecure=env.get("POLYRL_NATS_INSECURE", "").strip().lower() in TRUE,
            nats_user_ttl=_positive(env, "POLYRL_NATS_USER_TTL", d.nats_user_ttl),
            namespace=env.get("POLYRL_NAMESPACE", d.namespace),
            entrypoints=Entrypoints(
                worker=tuple(shlex.split(env.get("POLYRL_WORKER_COMMAND", "polyrl worker"))),
                trainer=tuple(
                    shlex.split(env.get("POLYRL_TRAINER_ENTRY", "-m polyrl.workers.trainer"))
                ),
            ),
            default_image=env.get("POLYRL_DEFAULT_WORKER_IMAGE") or None,
            status_interval=float(env.get("POLYRL_STATUS_INTERVAL", d.status_interval)),
            status_progress_interval=_positive(
                env, "POLYRL_STATUS_PROGRESS_INTERVAL", d.status_progress_interval
            ),
            nats_timeout=float(env.get("POLYRL_NATS_TIMEOUT", d.nats_timeout)),
            cleanup_timeout=float(env.get("POLYRL_CLEANUP_TIMEOUT", d.cleanup_timeout)),
        )


def problems(settings: OperatorSettings) -> list[str]:
    """Why the operator must not start with `settings` (empty: it may)."""
    if settings.nats_signing_secret or settings.nats_insecure:
        return []
    return [
        "no NATS signing Secret (POLYRL_NATS_SIGNING_SECRET, chart nats.signingSecret): jobs "
        "would share one NATS login, and every pod could read and write every job's data. "
        "Make one with `polyrl nats-trust DIR` and `kubectl apply -f DIR/signing-secret.yaml`, "
        "or opt in to shared NATS with POLYRL_NATS_INSECURE=true (chart nats.insecure=true)"
    ]


def _positive(env: dict[str, str], name: str, default: float) -> float:
    value = float(env.get(name) or default)
    if value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {env[name]!r}")
    return value
