"""What every worker process shares: its config, its NATS connection, heartbeats, signals.

A worker takes every input from its environment, as a pod does: the config document in
POLYRL_WORKER_CONFIG, its name in POLYRL_POD_NAME, NATS credentials in POLYRL_NATS_TOKEN,
POLYRL_NATS_CREDS or POLYRL_NATS_CREDS_FILE (from a Secret, never logged). A creds file is
read again on every reconnect, and the connection reconnects when its user expires
(`polyrl.api.natsclient`), so a pod's user renewed in its mounted Secret is picked up without
a restart. SIGTERM and SIGINT set `stopping`, so a worker finishes or hands back what it
holds before it exits. Malformed messages are dead-lettered with the reason and counted;
they never crash a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import ValidationError

from polyrl.api import access, natsclient, natsconfig, natstls
from polyrl.api.launch import (
    CONFIG_ENV,
    EXIT_INVALID_INPUT,
    EXIT_UNAVAILABLE,
    INVALID_INPUT_PREFIX,
    NATS_CREDS_ENV,
    NATS_CREDS_FILE_ENV,
    POD_NAME_ENV,
    TERMINATION_LOG,
    TERMINATION_LOG_ENV,
    TRAINER_DIR_ENV,
    WorkerConfig,
    trainer_subdir,
)
from polyrl.api.messages import Heartbeat, WorkerState
from polyrl.api.naming import JobNames
from polyrl.api.wire import DeadLetter, GenerationResponse
from polyrl.workers.errors import ConfigError, Unavailable
from polyrl.workers.runtime import outage, tensorboard
from polyrl.workers.runtime import prometheus as worker_metrics
from polyrl.workers.runtime.prometheus import WorkerMetrics

log = logging.getLogger("polyrl.worker")
HEARTBEAT_SECONDS = 2.0
MAX_DEAD_LETTER_BYTES = 64 * 1024
# How long closing waits for subscriptions to finish what they hold and for publishes to flush.
# A subscription left holding messages nobody will read (a pull request's late deliveries)
# holds a drain until this timeout; nats-py's default, 30 s, delayed every quick start's exit.
DRAIN_SECONDS = 5


TORCH_THREADS_ENV = "POLYRL_TORCH_THREADS"


def workdir_for(config: WorkerConfig) -> Path:
    """A trainer's (or a frozen policy's publisher's) directory: models, then checkpoints."""
    root = Path(os.environ.get(TRAINER_DIR_ENV, Path(tempfile.gettempdir()) / "polyrl"))
    return root / trainer_subdir(config.namespace, config.job, config.policy or "policy")


def torch_threads() -> int:
    """torch's intra-op thread count for this worker: $POLYRL_TORCH_THREADS, default 1.

    One by default because a local run puts several workers on few cores, and because the
    trainer's delta encoder runs beside its next step, in a process of its own: with every core
    in torch's pool, the step waits whenever the encoder takes one (docs/benchmarks.md, delta
    encoding).
    """
    return int(os.environ.get(TORCH_THREADS_ENV, "1"))


METRICS_FILE_ENV = "POLYRL_METRICS_FILE"
STAGES_FILE = "stages.jsonl"


class MetricsLog:
    """The run's metrics JSONL ($POLYRL_METRICS_FILE, set by `polyrl run`), which trainers and
    the workflow runner append to, and the same figures as TensorBoard event files in
    `tensorboard/` beside it (`runtime.tensorboard`); without a path, writing does nothing."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.events = (
            None if path is None else tensorboard.EventWriter(path.with_name(tensorboard.DIRECTORY))
        )

    @classmethod
    def from_env(cls) -> MetricsLog:
        path = os.environ.get(METRICS_FILE_ENV)
        return cls(Path(path) if path else None)

    def write(self, records: list[dict[str, Any]], *, path: Path | None = None) -> None:
        """Append `records`, a line each (whole lines: readers skip a torn last one)."""
        path = path or self.path
        if path is None or not records:
            return
        with path.open("a") as out:
            out.writelines(json.dumps(record) + "\n" for record in records)
        if path == self.path and self.events is not None:
            self.events.write(records)

    def stage(self, policy: str, stage: str) -> None:
        """Note what a trainer does now (warming up, evaluating, training) in `stages.jsonl`
        beside the metrics, which a run's progress display shows."""
        if self.path is not None:
            record = {"policy": policy, "stage": stage, "time": time.time()}
            self.write([record], path=self.path.with_name(STAGES_FILE))


def fail(prog: str, err: Exception) -> int:
    """Report why this worker stops, on stderr and in its termination message (what the
    operator quotes in its conditions, and `polyrl run` prints), and its exit status."""
    invalid = isinstance(err, ConfigError)
    said = f"{INVALID_INPUT_PREFIX if invalid else ''}{err}"
    print(f"{prog}: {said}", file=sys.stderr, flush=True)
    path = os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG)
    # No such file outside a pod (or a local run): stderr has it.
    with contextlib.suppress(OSError), open(path, "w") as out:
        out.write(said[:4000] + "\n")
    return EXIT_INVALID_INPUT if invalid else EXIT_UNAVAILABLE


def load_config(env: dict[str, str] | None = None) -> tuple[WorkerConfig, str]:
    env = dict(os.environ if env is None else env)
    raw = env.get(CONFIG_ENV)
    if not raw:
        raise ConfigError(f"{CONFIG_ENV} is not set: a worker needs its config document")
    try:
        config = WorkerConfig.model_validate_json(raw)
    except ValueError as err:
        raise ConfigError(f"{CONFIG_ENV} is not a valid worker config: {err}") from None
    pod = env.get(POD_NAME_ENV) or f"{socket.gethostname()}-{config.role}-{config.replica}"
    return config, pod


def _credentials() -> dict[str, Any]:
    """nats.connect's options from the pod's env: a token or a creds file, and TLS."""
    options: dict[str, Any] = {}
    tls_dir = os.environ.get(natstls.TLS_DIR_ENV)
    if tls_dir and (tls := natstls.context(Path(tls_dir))) is not None:
        options["tls"] = tls
    if token := os.environ.get("POLYRL_NATS_TOKEN"):
        return options | {"token": token}
    if path := os.environ.get(NATS_CREDS_FILE_ENV):
        return options | {"user_credentials": path}
    if creds := os.environ.get(NATS_CREDS_ENV):
        fd, path = tempfile.mkstemp(prefix="polyrl-", suffix=".creds")
        with os.fdopen(fd, "w") as out:
            out.write(creds)
        return options | {"user_credentials": path}
    return options


def has_user() -> bool:
    """This worker connects with creds (its role's user): streams are made by an admin."""
    return NATS_CREDS_FILE_ENV in os.environ or NATS_CREDS_ENV in os.environ


@dataclass
class Runtime:
    """A connected worker: config, NATS, the job's names, its heartbeat and stop flag."""

    config: WorkerConfig
    pod: str
    nc: NatsClient
    js: JetStreamContext
    names: JobNames
    kv: KeyValue
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    state: WorkerState = WorkerState.STARTING
    figures: dict[str, Any] = field(default_factory=dict)
    dead_letters: int = 0
    lettered: set[str] = field(default_factory=set)  # malformed announcements dead-lettered
    exported: WorkerMetrics | None = None  # Prometheus gauges, where a port is set
    said: WorkerState | None = None  # the state of the last heartbeat NATS took

    def not_ready(self) -> str | None:
        """Why this worker's pod is not Ready (its readiness probe), or None: it is once a
        heartbeat said that it serves, trains or runs episodes, so the operator's view and
        the pod's agree."""
        if self.said is not None and self.said.is_ready() and self.state.is_ready():
            return None
        return f"{self.config.role} is {self.state}" + (
            "" if self.said == self.state else " (not yet in a heartbeat)"
        )

    async def enter(self, state: WorkerState) -> None:
        """Change state and say so at once (readiness follows the heartbeat)."""
        self.state = state
        await self.beat()

    @classmethod
    async def connect(cls, config: WorkerConfig, pod: str, *, timeout: float = 10.0) -> Runtime:
        names = JobNames(namespace=config.namespace, job=config.job)
        tls_dir = os.environ.get(natstls.TLS_DIR_ENV)
        errors = natstls.LastError(
            log, no_client_cert=bool(tls_dir) and natstls.lacks_client_cert(Path(tls_dir or "."))
        )
        try:
            nc = await asyncio.wait_for(
                natsclient.connect(
                    config.nats_url,
                    max_reconnect_attempts=-1,
                    drain_timeout=DRAIN_SECONDS,
                    error_cb=errors.record,
                    inbox_prefix=access.inbox_prefix(names, config.role, config.policy),
                    **_credentials(),
                ),
                timeout=timeout,
            )
        except (TimeoutError, OSError, nats.errors.Error) as err:
            raise Unavailable(
                f"cannot reach NATS at {config.nats_url}: {errors.why(err)}"
            ) from None
        js = nc.jetstream()
        if not has_user():  # a role's user may not create: its job's admin did
            await natsconfig.ensure(js, names, [p.name for p in config.spec.policies])
        kv = await js.key_value(names.heartbeats_bucket)
        return cls(config=config, pod=pod, nc=nc, js=js, names=names, kv=kv)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)

    async def heartbeat_forever(self) -> None:
        """Beat every HEARTBEAT_SECONDS; serve the figures to Prometheus too, if asked to."""
        if self.exported is None:
            self.exported = worker_metrics.from_env(
                str(self.config.role), self.config.policy or "", ready=self.not_ready
            )
        while True:
            await self.beat()
            await asyncio.sleep(HEARTBEAT_SECONDS)

    async def beat(self, *, required: bool = False) -> None:
        """Put this worker's heartbeat now (also between the periodic ones, when a figure that
        others act on changes: a trainer's weight version, read by the workflow runner).
        A periodic one lost to a NATS outage is simply followed by the next; a `required` one
        (a trainer's last, which the operator reads its final figures from) waits it out."""
        key = JobNames.heartbeat_key(self.config.policy, str(self.config.role), self.pod)
        beat = Heartbeat(
            pod=self.pod,
            role=str(self.config.role),
            policy=self.config.policy,
            state=self.state,
            at=time.time(),
            dead_letters=self.dead_letters,
            **self.figures,
        )
        if self.exported is not None:
            self.exported.observe(beat)
        body = beat.model_dump_json().encode()
        if required:
            await outage.retry(lambda: self.kv.put(key, body), what=f"the heartbeat of {self.pod}")
        else:
            try:
                await self.kv.put(key, body)
            except Exception:  # NATS may be reconnecting; try next beat
                return
        self.said = WorkerState(beat.state)

    async def dead_letter(self, subject: str, data: bytes, error: str) -> None:
        """Keep a message we cannot use, with why, on the job's dead-letter stream."""
        self.dead_letters += 1
        letter = DeadLetter(
            subject=subject,
            worker=self.pod,
            error=error[:2000],
            data=data[:MAX_DEAD_LETTER_BYTES].decode(errors="replace"),
            at=time.time(),
        )
        log.warning("dead-lettered a message on %s: %s", subject, error[:200])
        with contextlib.suppress(Exception):
            await self.js.publish(self.names.dead_letter_subject, letter.model_dump_json().encode())

    async def resolve_reply(
        self, msg: Msg, waiting: Mapping[str, asyncio.Future[GenerationResponse]]
    ) -> None:
        """Hand a generation reply to the request waiting for it (by id); a malformed one is
        dead-lettered. A reply nobody waits for any more (answered twice, or retried under a
        fresh id) is dropped: its request has its answer."""
        try:
            response = GenerationResponse.model_validate_json(msg.data)
        except ValidationError as err:
            await self.dead_letter(msg.subject, msg.data, f"malformed response: {err}")
            return
        future = waiting.get(response.id)
        if future is not None and not future.done():
            future.set_result(response)

    def malformed_announcements(self, policy: str) -> Callable[[int, bytes, str], Awaitable[None]]:
        """What `announce.latest` tells of a malformed announcement: dead-letter it, once per
        stream sequence (the newest one is read again at every refresh until replaced)."""
        subject = self.names.weights_subject(policy)

        async def letter(seq: int, data: bytes, error: str) -> None:
            if (key := f"{subject}#{seq}") not in self.lettered:
                self.lettered.add(key)
                await self.dead_letter(subject, data, error)

        return letter

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()
