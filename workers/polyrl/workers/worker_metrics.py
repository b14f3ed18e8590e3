"""Prometheus metrics of a worker, served on `POLYRL_METRICS_PORT` when it is set.

The operator sets the port in every worker pod and declares it as the container's `metrics`
port, so a Prometheus (or `kubectl port-forward`) can scrape any trainer, rollout worker or
workflow runner. The figures are the heartbeat's: `observe` copies each heartbeat into the
gauges as it is put, so the metrics and the status the operator derives from heartbeats
never disagree. A local run (`polyrl run`) sets no port: its figures are in metrics.jsonl.

| metric | what |
|---|---|
| `polyrl_worker_info{role,policy,pod}` | 1; labels say who this is |
| `polyrl_worker_weight_version` | weights served (rollout) or trained from (trainer) |
| `polyrl_worker_step` | trainer step |
| `polyrl_worker_requests_served` | generation requests answered (rollout), episodes done (runner) |
| `polyrl_worker_in_flight` | requests being generated now |
| `polyrl_worker_tokens_per_second` | recent generation throughput |
| `polyrl_worker_reward` | recent mean reward (trainer, runner) |
| `polyrl_worker_held_out` | the trainer's last held-out figure |
| `polyrl_worker_idle_fraction` | share of time with nothing to do |
| `polyrl_worker_dropped_prompts` | episodes dropped: prompt too long or refused (runner) |
| `polyrl_worker_dropped_samples` | samples dropped: their reward failed (runner) |
| `polyrl_worker_dead_letters` | messages this worker could not parse |
"""

from __future__ import annotations

import logging
import os

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from polyrl.api.messages import Heartbeat

log = logging.getLogger("polyrl.worker")
PORT_ENV = "POLYRL_METRICS_PORT"
# Heartbeat field -> gauge name (without the prefix) and help; None values are left unset.
FIGURES = {
    "weight_version": "weights served (rollout) or trained from (trainer)",
    "step": "trainer step",
    "requests_served": "generation requests answered (rollout) or episodes done (runner)",
    "in_flight": "requests being generated now",
    "tokens_per_second": "recent generation throughput",
    "reward": "recent mean reward",
    "held_out": "the trainer's last held-out figure",
    "idle_fraction": "share of the time with nothing to do",
    "dropped_prompts": "episodes dropped: prompt too long or refused",
    "dropped_samples": "samples dropped: their reward failed",
    "dead_letters": "messages this worker could not parse",
}


class WorkerMetrics:
    """The gauges of one worker process, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.info = Gauge(
            "polyrl_worker_info", "1, labelled with who this worker is", ["role", "policy", "pod"],
            registry=self.registry,
        )  # fmt: skip
        self.gauges = {
            field: Gauge(f"polyrl_worker_{field}", text, registry=self.registry)
            for field, text in FIGURES.items()
        }

    def observe(self, beat: Heartbeat) -> None:
        self.info.labels(beat.role, beat.policy or "", beat.pod).set(1)
        for field, gauge in self.gauges.items():
            value = getattr(beat, field)
            if value is not None:
                gauge.set(float(value))

    def serve(self, port: int) -> None:
        start_http_server(port, addr="0.0.0.0", registry=self.registry)


def from_env() -> WorkerMetrics | None:
    """Metrics served on $POLYRL_METRICS_PORT; None where it is not set, or where the port
    cannot be had (a warning: metrics are not worth stopping a worker for)."""
    port = os.environ.get(PORT_ENV)
    if not port:
        return None
    metrics = WorkerMetrics()
    try:
        metrics.serve(int(port))
    except (OSError, ValueError) as err:
        log.warning("no Prometheus metrics: cannot serve on port %s: %s", port, err)
        return None
    return metrics
