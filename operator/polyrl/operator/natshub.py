"""The operator's NATS side: connections, a job's streams, heartbeats, drain messages.

One connection per (URL, credentials Secret), shared by the jobs that use it. Heartbeats
are mirrored into memory by a KV watch per job, and Drained messages by a subscription per
job, so status and scale-down read memory instead of polling NATS. Every operation is
bounded by `settings.nats_timeout`; callers turn failures into conditions and retry.
Credentials are read from the Secret at connect time and never logged.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import nats
from kubernetes.client.exceptions import ApiException
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from polyrl.api import access, natsconfig, natsjwt, natstls
from polyrl.api.messages import DrainAck, Drained, DrainRequest, Heartbeat
from polyrl.api.naming import A_NATS_URL, JobNames
from polyrl.api.resources import RLJob
from polyrl.operator import natsusers
from polyrl.operator.kube import Kube
from polyrl.operator.settings import OperatorSettings

log = logging.getLogger("polyrl.operator.nats")
# (namespace, pod, progress=) -> wake the pod's group; progress news are rate-limited
Wake = Callable[..., None]


class NatsUnavailable(RuntimeError):
    """NATS could not be reached or did not answer in time."""


class JobChannel:
    """Per-job mirrors: heartbeats by key, and pods that reported Drained."""

    def __init__(self) -> None:
        self.heartbeats: dict[str, Heartbeat] = {}
        self.drained: dict[str, Drained] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.subs: list[Subscription] = []
        self.watchers: list[Any] = []  # KV watchers: each holds a subscription of its own

    async def close(self) -> None:
        """Stop everything this job opened: a KV watcher left running keeps re-creating its
        consumer on a deleted stream ("stream not found", every few seconds, forever)."""
        for watcher in self.watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()
        for sub in self.subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for task in self.tasks:
            task.cancel()
        self.subs.clear()
        self.tasks.clear()
        self.watchers.clear()


def _tls(data: Mapping[str, str]) -> dict[str, Any]:
    """TLS from the Secret's `ca.crt` (and `tls.crt`, `tls.key`), as the workers read them
    from its mount (`natstls`); no options without a CA."""
    if natstls.CA not in data:
        return {}
    directory = Path(tempfile.mkdtemp(prefix="polyrl-nats-tls-"))
    for name in (natstls.CA, natstls.CERT, natstls.KEY):
        if name in data:
            (directory / name).write_bytes(base64.b64decode(data[name]))
    return {"tls": natstls.context(directory)}


class NatsHub:
    def __init__(self, kube: Kube, settings: OperatorSettings, wake: Wake) -> None:
        self.kube = kube
        self.settings = settings
        self.wake = wake
        self.conns: dict[tuple[str, str | None, str], NatsClient] = {}
        self.channels: dict[tuple[str, str], JobChannel] = {}
        self.ensured: dict[tuple[str, str], int] = {}  # job -> generation ensured
        self.lacks_client_cert: dict[tuple[str, str | None, str], bool] = {}  # TLS, no cert
        self._signer: natsjwt.Signer | None = None

    async def signer(self) -> natsjwt.Signer | None:
        """The account signing key (`settings.nats_signing_secret`), read once; None without
        one. A Secret that is missing or malformed is `NatsUnavailable`: a condition on the
        job, retried."""
        if self._signer is None and self.settings.nats_signing_secret:
            where = f"Secret {self.settings.namespace}/{self.settings.nats_signing_secret}"
            try:
                data = await self.kube.read_secret(
                    self.settings.namespace, self.settings.nats_signing_secret
                )
                self._signer = natsusers.signer_from(data, where)
            except (ApiException, natsusers.SigningKeyInvalid) as err:
                reason = f"HTTP {err.status}" if isinstance(err, ApiException) else str(err)
                if isinstance(err, ApiException) and err.status == 404:
                    reason = (
                        "no such Secret; make it with `polyrl nats-trust DIR` and `kubectl "
                        "apply -f DIR/signing-secret.yaml`"
                    )
                raise NatsUnavailable(f"cannot sign NATS users with {where}: {reason}") from None
        return self._signer

    def url_of(self, job: RLJob) -> str:
        """The job's own NATS, else the one it started on (`naming.A_NATS_URL`), else the
        operator's: changing the operator's default moves new jobs only."""
        pinned = job.metadata.annotations.get(A_NATS_URL)
        return job.spec.nats.url or pinned or self.settings.nats_url

    def _secret_of(self, job: RLJob) -> tuple[str | None, str]:
        if job.spec.nats.credentials_secret:
            return job.spec.nats.credentials_secret, job.metadata.namespace
        return self.settings.nats_credentials_secret, self.settings.namespace

    async def connect(self, job: RLJob) -> NatsClient:
        url = self.url_of(job)
        secret, secret_ns = self._secret_of(job)
        key = (url, secret, secret_ns)
        conn = self.conns.get(key)
        if conn is not None and conn.is_connected:
            return conn
        options = await self._credentials(url, secret, secret_ns)
        errors = natstls.LastError(log, no_client_cert=self.lacks_client_cert.get(key, False))
        try:
            conn = await asyncio.wait_for(
                nats.connect(
                    url,
                    name="polyrl-operator",  # how monitoring (/connz) tells its connections
                    connect_timeout=self.settings.nats_timeout,
                    max_reconnect_attempts=-1,
                    allow_reconnect=True,
                    error_cb=errors.record,
                    **options,
                ),
                timeout=self.settings.nats_timeout * 2,
            )
        except (TimeoutError, OSError, nats.errors.Error) as err:
            raise NatsUnavailable(f"cannot connect to NATS at {url}: {errors.why(err)}") from None
        self.conns[key] = conn
        return conn

    async def _credentials(self, url: str, secret: str | None, namespace: str) -> dict[str, Any]:
        data = await self.kube.read_secret(namespace, secret) if secret else {}
        options = self._secret_options(url, secret, namespace, data)
        signer = await self.signer()
        if signer is not None and not ({"token", "user_credentials", "user"} & options.keys()):
            fd, path = tempfile.mkstemp(prefix="polyrl-nats-", suffix=".creds")
            with os.fdopen(fd, "w") as out:  # itself: an admin user it signs
                out.write(signer.user_creds("polyrl-operator", access.ADMIN))
            options["user_credentials"] = path
        return options

    def _secret_options(
        self, url: str, secret: str | None, namespace: str, data: dict[str, str]
    ) -> dict[str, Any]:
        options = _tls(data)
        self.lacks_client_cert[(url, secret, namespace)] = natstls.CA in data and not (
            natstls.CERT in data and natstls.KEY in data
        )
        if "token" in data:
            return options | {"token": base64.b64decode(data["token"]).decode()}
        if "creds" in data:
            fd, path = tempfile.mkstemp(prefix="polyrl-nats-", suffix=".creds")
            with os.fdopen(fd, "wb") as out:
                out.write(base64.b64decode(data["creds"]))
            return options | {"user_credentials": path}
        if "user" in data and "password" in data:
            return options | {
                "user": base64.b64decode(data["user"]).decode(),
                "password": base64.b64decode(data["password"]).decode(),
            }
        return options

    async def ensure_job(self, job: RLJob) -> None:
        """Streams and buckets exist, and this job's mirrors run (once per generation)."""
        key = (job.metadata.namespace, job.metadata.name)
        if self.ensured.get(key) == job.metadata.generation and key in self.channels:
            return
        conn = await self.connect(job)
        names = JobNames(namespace=job.metadata.namespace, job=job.metadata.name)
        policies = [p.name for p in job.spec.policies]
        try:
            await asyncio.wait_for(
                natsconfig.ensure(conn.jetstream(), names, policies),
                timeout=self.settings.nats_timeout * 4,
            )
        except (TimeoutError, nats.errors.Error) as err:
            raise NatsUnavailable(
                f"cannot create the job's streams: {type(err).__name__}"
            ) from None
        if key not in self.channels:
            self.channels[key] = await self._open_channel(conn, names)
        self.ensured[key] = job.metadata.generation

    async def _open_channel(self, conn: NatsClient, names: JobNames) -> JobChannel:
        channel = JobChannel()

        async def on_drained(msg: Any) -> None:
            try:
                drained = Drained.model_validate_json(msg.data)
            except ValidationError:
                log.warning("malformed Drained message on %s ignored", msg.subject)
                return
            channel.drained[drained.pod] = drained
            self.wake(names.namespace, drained.pod)

        channel.subs.append(await conn.subscribe(names.drained_wildcard, cb=on_drained))
        kv = await conn.jetstream().key_value(names.heartbeats_bucket)
        watcher = await kv.watchall()
        channel.watchers.append(watcher)
        channel.tasks.append(asyncio.create_task(self._mirror(watcher, channel, names.namespace)))
        return channel

    async def _mirror(self, watcher: Any, channel: JobChannel, namespace: str) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            if entry.value is None or entry.operation in ("DEL", "PURGE"):
                channel.heartbeats.pop(entry.key, None)
                continue
            try:
                beat = Heartbeat.model_validate_json(entry.value)
            except ValidationError:
                log.warning("malformed heartbeat under %s ignored", entry.key)
                continue
            before = channel.heartbeats.get(entry.key)
            channel.heartbeats[entry.key] = beat
            if before is None or before.state != beat.state:
                self.wake(namespace, beat.pod)  # a worker that starts, drains or is done
            elif _figures(before) != _figures(beat):
                self.wake(namespace, beat.pod, progress=True)  # status shows it soon
                for pod in _served_pods(channel, beat):  # a shared pool's news is theirs too
                    self.wake(namespace, pod, progress=True)

    def channel(self, namespace: str, job: str) -> JobChannel | None:
        return self.channels.get((namespace, job))

    async def request_drain(self, job: RLJob, policy: str, pod: str, drain_seconds: float) -> bool:
        """Ask `pod` to drain; True when it acknowledged (it answers once more as Drained)."""
        names = JobNames(namespace=job.metadata.namespace, job=job.metadata.name)
        try:
            conn = await self.connect(job)
            reply = await conn.request(
                names.drain_subject(policy, pod),
                DrainRequest(pod=pod, timeout_seconds=drain_seconds).model_dump_json().encode(),
                timeout=min(2.0, self.settings.nats_timeout),
            )
            DrainAck.model_validate_json(reply.data)
        except (NatsUnavailable, TimeoutError, nats.errors.Error, ValidationError) as err:
            log.info("drain request to %s not acknowledged: %s", pod, type(err).__name__)
            return False
        return True

    async def remove_job(self, job: RLJob) -> list[str]:
        key = (job.metadata.namespace, job.metadata.name)
        channel = self.channels.pop(key, None)
        if channel is not None:
            await channel.close()
        self.ensured.pop(key, None)
        conn = await self.connect(job)
        names = JobNames(namespace=job.metadata.namespace, job=job.metadata.name)
        return await natsconfig.remove(conn.jetstream(), names, [p.name for p in job.spec.policies])

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        for conn in self.conns.values():
            with contextlib.suppress(Exception):
                await conn.close()


def _figures(beat: Heartbeat) -> tuple[object, ...]:
    served = tuple(sorted((k, v.weight_version) for k, v in (beat.pool or {}).items()))
    return (beat.state, beat.weight_version, beat.step, beat.reward, served)


def _served_pods(channel: JobChannel, beat: Heartbeat) -> list[str]:
    """Pods of the other policies a shared pool's heartbeat speaks for (their groups show
    the versions it serves them at: `groupstatus._served_versions`)."""
    others = set(beat.pool or {}) - {beat.policy}
    return [hb.pod for hb in channel.heartbeats.values() if hb.policy in others]
