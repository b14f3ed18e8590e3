"""FAKE worker for control-plane tests: speaks the worker contract, computes nothing.

This stands in for the real rollout, trainer and workflow workers in the operator's tests
(until they exist, and wherever a test needs a worker it can steer). It does what the
operator relies on, over real NATS:

- reads its single config document (POLYRL_WORKER_CONFIG) and pod name (POLYRL_POD_NAME);
- heartbeats into the job's KV bucket every 0.5 s (state, weight version, trainer step);
- answers the pod's readiness probe on $POLYRL_METRICS_PORT once a heartbeat said it
  serves (the real workers' `worker_metrics`);
- rollout: pulls requests from the policy's work queue one at a time, "generates" by
  sleeping `work_seconds`, replies on the request's `reply_to` subject with its pod name,
  and acks only after replying (so a killed worker's request is redelivered);
- drain: answers a DrainRequest with a DrainAck, stops pulling, finishes what it holds,
  then publishes Drained on its drained subject;
- trainer: raises its step by one every `POLYRL_FAKE_STEP_SECONDS` (default 0.5 s), and
  its weight version with it, up to the policy's last step; then heartbeats `done` and
  exits 0; workflow: only heartbeats.

Run as `python fake_worker.py rollout|workflow` (the operator's worker command), or by
torchrun as the trainer entry (role taken from the config document); `python fake_worker.py
trainer torchrun ...`, a trainer pod's command, checks nothing and becomes torchrun.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import nats
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from polyrl.api import natsconfig
from polyrl.api.launch import CONFIG_ENV, POD_NAME_ENV, WorkerConfig
from polyrl.api.messages import DrainAck, Drained, DrainRequest, Heartbeat, WorkerState
from polyrl.api.naming import JobNames
from polyrl.workers.runtime import prometheus as worker_metrics


class FakeWorker:
    def __init__(self, config: WorkerConfig, pod: str) -> None:
        self.config = config
        self.pod = pod
        self.names = JobNames(namespace=config.namespace, job=config.job)
        self.state = WorkerState.SERVING
        self.served = 0
        self.in_flight = 0
        self.step = 0
        self.stop = asyncio.Event()
        self.said: WorkerState | None = None  # the last heartbeat's state NATS took

    async def run(self) -> None:
        self.nc = await nats.connect(self.config.nats_url, max_reconnect_attempts=-1)
        self.js = self.nc.jetstream()
        policies = [p.name for p in self.config.spec.policies]
        await natsconfig.ensure(self.js, self.names, policies)
        self.kv = await self.js.key_value(self.names.heartbeats_bucket)
        tasks = [asyncio.create_task(self._heartbeat())]
        worker_metrics.from_env(str(self.config.role), self.config.policy or "", ready=self.why)
        role = str(self.config.role)
        if role == "rollout":
            policy = self.config.policy or ""
            await self.nc.subscribe(self.names.drain_subject(policy, self.pod), cb=self._on_drain)
            tasks.append(asyncio.create_task(self._serve(policy)))
        elif role == "trainer":
            self.state = WorkerState.TRAINING
            tasks.append(asyncio.create_task(self._train()))
        await self.stop.wait()
        for task in tasks:
            task.cancel()
        await self.nc.drain()

    async def _heartbeat(self) -> None:
        while True:
            await self._beat()
            await asyncio.sleep(0.5)

    async def _beat(self) -> None:
        key = JobNames.heartbeat_key(self.config.policy, str(self.config.role), self.pod)
        beat = Heartbeat(
            pod=self.pod,
            role=str(self.config.role),
            policy=self.config.policy,
            state=self.state,
            weight_version=self.step,
            step=self.step,
            requests_served=self.served,
            in_flight=self.in_flight,
            at=time.time(),
            reward=self.step / 100 if str(self.config.role) == "trainer" else None,
        )
        await self.kv.put(key, beat.model_dump_json().encode())
        self.said = WorkerState(beat.state)

    def why(self) -> str | None:
        """Why this pod is not Ready (None: it is), as the real workers' readiness says."""
        ready = self.said is not None and self.said.is_ready() and self.state.is_ready()
        return None if ready else f"{self.state}"

    async def _train(self) -> None:
        """A step every period until the policy's last step (if it has one); then, as the
        real trainer does, a last heartbeat saying it is done, and exit 0."""
        period = float(os.environ.get("POLYRL_FAKE_STEP_SECONDS", "0.5"))
        policy = self.config.spec.policy(self.config.policy or "")
        last = self.config.spec.steps_of(policy) if policy is not None else None
        while last is None or self.step < last:
            await asyncio.sleep(period)
            self.step += 1
        self.state = WorkerState.DONE
        await self._beat()
        self.stop.set()

    async def _serve(self, policy: str) -> None:
        sub = await self.js.pull_subscribe(
            self.names.requests_subject(policy),
            durable=self.names.rollout_consumer,
            stream=self.names.requests_stream(policy),
        )
        while self.state == WorkerState.SERVING:
            try:
                msgs = await sub.fetch(1, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError, NotFoundError):
                continue
            for msg in msgs:
                self.in_flight += 1
                try:
                    request = json.loads(msg.data)
                    await asyncio.sleep(float(request.get("work_seconds", 0.1)))
                    reply = {"id": request["id"], "pod": self.pod}
                    await self.nc.publish(request["reply_to"], json.dumps(reply).encode())
                    await self.nc.flush()
                    await msg.ack()
                    self.served += 1
                finally:
                    self.in_flight -= 1
        await self._finish_drain(policy)

    async def _on_drain(self, msg: Msg) -> None:
        DrainRequest.model_validate_json(msg.data)
        if self.state == WorkerState.DRAINED:  # asked again (the operator restarted)
            await msg.respond(DrainAck(pod=self.pod, in_flight=0).model_dump_json().encode())
            await self._announce_drained(self.config.policy or "")
            return
        self.state = WorkerState.DRAINING
        await msg.respond(
            DrainAck(pod=self.pod, in_flight=self.in_flight).model_dump_json().encode()
        )

    async def _finish_drain(self, policy: str) -> None:
        # `_serve` handles one request at a time, so nothing is in flight once it stops.
        self.state = WorkerState.DRAINED
        await self._announce_drained(policy)

    async def _announce_drained(self, policy: str) -> None:
        drained = Drained(pod=self.pod, served=self.served, at=time.time())
        await self.nc.publish(
            self.names.drained_subject(policy, self.pod), drained.model_dump_json().encode()
        )
        await self.nc.flush()


def main() -> int:
    if sys.argv[1:2] == ["trainer"]:  # `<worker> trainer torchrun ...`: nothing to check
        os.execvp(sys.argv[2], sys.argv[2:])
    config = WorkerConfig.model_validate_json(os.environ[CONFIG_ENV])
    pod = os.environ.get(POD_NAME_ENV) or f"{config.policy_group}-{config.role}-{config.replica}"
    worker = FakeWorker(config, pod)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop.set)
        await worker.run()

    asyncio.run(go())
    return 0


if __name__ == "__main__":
    sys.exit(main())
