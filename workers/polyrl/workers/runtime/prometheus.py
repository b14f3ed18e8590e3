"""Prometheus metrics and readiness of a worker, served on `POLYRL_METRICS_PORT` when it is set.

The operator sets the port in every worker pod and declares it as the container's `metrics`
port, so a Prometheus (or `kubectl port-forward`) can scrape any trainer, rollout worker or
workflow runner. The figures are the heartbeat's: `observe` copies each heartbeat into the
gauges as it is put, so the metrics and the status the operator derives from heartbeats
never disagree. A local run (`polyrl run`) sets no port: its figures are in metrics.jsonl.

The same port answers the pod's readiness probe at `/ready`: 200 once the worker does its
job (a rollout worker serves the current weights, a trainer trains, a workflow runner runs
episodes) and has said so in a heartbeat, 503 with why not before that and while it drains.
So a pod is Ready when it serves, not when its process starts: what `RolloutsReady`, the
job's `Ready` and the operator's scale latency are made of.

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
| `polyrl_worker_dropped_episodes{of,reason}` | episodes dropped whole, by policy and reason: prompt, generation, turns, context, tool, environment, judge (runner) |
| `polyrl_worker_judge_fallbacks{of}` | failed verdicts of a judging policy replaced by workflow.judge.fallbackScore (runner) |
| `polyrl_worker_dead_letters` | messages this worker could not parse |
| `polyrl_worker_staleness_p50`, `_p95` | the trainer's last batch: sample age in versions |
| `polyrl_worker_stale_dropped` | samples the trainer dropped as older than maxStaleness |
| `polyrl_worker_is_deviation` | the trainer's last step: mean abs(w - 1) of its importance weights w = current/behaviour |
| `polyrl_worker_clip_fraction` | the trainer's last step: share of trained tokens the objective clipped or masked |
| `polyrl_worker_is_m2` | the trainer's last step: mean (log w)^2, the second moment M2PO bounds |
| `polyrl_worker_sync_seconds` | the rollout's last weight sync: seconds (fetch and apply) |
| `polyrl_worker_sync_bytes` | the rollout's last weight sync: bytes read |
| `polyrl_worker_changed_fraction` | share of the weights the last delta rewrote |
| `polyrl_worker_weights_refused` | weight objects the rollout refused (and resynced around) |
| `polyrl_worker_sync_failures` | syncs that found no path to the announced version |
| `polyrl_worker_queue_depth` | requests of the policy waiting, not yet taken |
| `polyrl_worker_staleness` (histogram) | age of every trained sample, in weight versions |
| `polyrl_worker_published_bytes_total{kind}` | bytes the trainer published, by object kind |
| `polyrl_worker_published_objects_total{kind}` | weight objects the trainer published, by kind |

The trainer's kinds: `keyframe` and `delta` (the model), `adapter` and `adapter-delta` (a
LoRA adapter under adapter sync) and `base` (the frozen base adapters are served on, once).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from http.server import ThreadingHTTPServer
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import MetricsHandler

from polyrl.api.messages import Heartbeat

log = logging.getLogger("polyrl.worker")
PORT_ENV = "POLYRL_METRICS_PORT"
READY_PATH = "/ready"  # the pod's readiness probe (`polyrl.operator.render`)
# Why a worker is not ready, or None when it is.
Readiness = Callable[[], str | None]
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
    "staleness_p50": "median sample age of the trainer's last batch, in weight versions",
    "staleness_p95": "95th percentile sample age of the trainer's last batch",
    "stale_dropped": "samples the trainer dropped as older than maxStaleness",
    "is_deviation": "mean |w - 1| of the last step's importance weights (current/behaviour)",
    "clip_fraction": "share of the last step's trained tokens the objective clipped or masked",
    "is_m2": "mean squared log importance weight of the last step (M2PO's second moment)",
    "sync_seconds": "seconds the last weight sync took (fetch and apply)",
    "sync_bytes": "bytes the last weight sync read",
    "changed_fraction": "share of the weights' elements the last delta rewrote",
    "weights_refused": "weight objects refused (corrupt, wrong base, missing), in all",
    "sync_failures": "weight syncs that found no path to the announced version, in all",
    "queue_depth": "requests of the policy waiting in its queue, not yet taken",
}
# Sample ages in weight versions: maxStaleness is rarely above 8.
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16)


class WorkerMetrics:
    """The gauges of one worker process, in a registry of their own. Every series carries
    `role` and `policy` labels, so that dashboards can sum and split by them (Prometheus adds
    `namespace` and `pod` from the scrape target)."""

    def __init__(self, role: str = "", policy: str = "") -> None:
        self.registry = CollectorRegistry()
        self.info = Gauge(
            "polyrl_worker_info", "1, labelled with who this worker is", ["role", "policy", "pod"],
            registry=self.registry,
        )  # fmt: skip
        labels = {"role": role, "policy": policy}
        self.gauges = {
            field: Gauge(
                f"polyrl_worker_{field}", text, list(labels), registry=self.registry
            ).labels(**labels)
            for field, text in FIGURES.items()
        }
        self.staleness = Histogram(
            "polyrl_worker_staleness", "age of each trained sample, in weight versions",
            list(labels), buckets=STALENESS_BUCKETS, registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self.dropped = Gauge(
            "polyrl_worker_dropped_episodes", "episodes the runner dropped whole, by the policy "
            "they name (`of`) and reason", [*labels, "of", "reason"], registry=self.registry,
        )  # fmt: skip
        self.fallbacks = Gauge(
            "polyrl_worker_judge_fallbacks", "failed verdicts of a judging policy (`of`) "
            "replaced by workflow.judge.fallbackScore", [*labels, "of"], registry=self.registry,
        )  # fmt: skip
        self.published_bytes = Counter(
            "polyrl_worker_published_bytes", "bytes of weight objects published, by kind",
            [*labels, "kind"], registry=self.registry,
        )  # fmt: skip
        self.published_objects = Counter(
            "polyrl_worker_published_objects", "weight objects published, by kind",
            [*labels, "kind"], registry=self.registry,
        )  # fmt: skip
        self.labels = labels

    def observe_published(self, kind: str, size: int) -> None:
        """One weight object the trainer wrote (`trainer.leader.PublishedKind`)."""
        self.published_bytes.labels(**self.labels, kind=kind).inc(size)
        self.published_objects.labels(**self.labels, kind=kind).inc()

    def observe(self, beat: Heartbeat) -> None:
        self.info.labels(beat.role, beat.policy or "", beat.pod).set(1)
        for field, gauge in self.gauges.items():
            value = getattr(beat, field)
            if value is not None:
                gauge.set(float(value))
        for policy, reasons in (beat.dropped_episodes or {}).items():
            for reason, count in reasons.items():
                self.dropped.labels(**self.labels, of=policy, reason=reason).set(count)
        for policy, count in (beat.judge_fallbacks or {}).items():
            self.fallbacks.labels(**self.labels, of=policy).set(count)

    def observe_staleness(self, ages: Mapping[int, int]) -> None:
        """A trained batch's samples, counted by age (`grpo.age_histogram`)."""
        for age, count in ages.items():
            for _ in range(count):
                self.staleness.observe(age)

    def serve(self, port: int, ready: Readiness) -> ThreadingHTTPServer:
        """Metrics on every path but `READY_PATH`, which answers `ready()`; in a thread."""
        handler = type(
            "Handler", (_Handler,), {"registry": self.registry, "readiness": staticmethod(ready)}
        )
        server = ThreadingHTTPServer(("0.0.0.0", port), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


class _Handler(MetricsHandler):
    readiness: Readiness

    def do_GET(self) -> None:  # noqa: N802 (http.server names it)
        if urlparse(self.path).path != READY_PATH:
            super().do_GET()
            return
        why = type(self).readiness()
        body = f"{why or 'ready'}\n".encode()
        self.send_response(200 if why is None else 503)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def from_env(role: str = "", policy: str = "", *, ready: Readiness) -> WorkerMetrics | None:
    """Metrics and readiness served on $POLYRL_METRICS_PORT; None where it is not set, or
    where the port cannot be had (a warning: metrics are not worth stopping a worker for; its
    pod then never turns Ready, which says so too)."""
    port = os.environ.get(PORT_ENV)
    if not port:
        return None
    metrics = WorkerMetrics(role, policy)
    try:
        metrics.serve(int(port), ready)
    except (OSError, ValueError) as err:
        log.warning("no Prometheus metrics: cannot serve on port %s: %s", port, err)
        return None
    return metrics
