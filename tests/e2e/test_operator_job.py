"""The quick start on the test cluster: the operator runs examples/quickstart.yaml for real.

`kubectl apply` of the example file itself, in a namespace whose pods the node agent runs as
local processes with the real workers: trainers under torchrun, `polyrl worker rollout` and
`polyrl worker workflow`, all over the session's nats-server. Only the operator's worker
command differs from the chart's default: it runs `polyrl worker` under
`env OMP_NUM_THREADS=1 POLYRL_TORCH_THREADS=1` (one torch thread per process, as
`polyrl run` does; see tests/operator_stack.py).

One override fits the example into a CI time budget: the solver's supervised warm start,
`trainer.warmupSteps`, goes from the file's limit (thousands of steps, stopped early at
`warmupTargetAccuracy`; minutes on two cores) to `WARMUP_STEPS`: what it buys is accuracy,
which this test does not check. Everything else, `stop.steps` included, is the file's: the
job is still running when the test deletes it.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.js.errors import KeyValueError, NotFoundError
from tests import scrape
from tests.operator_stack import REPO, PodLogs, explained, wait_no_pod_processes

from polyrl.api.messages import Heartbeat
from polyrl.api.naming import JobNames
from polyrl.local.natsserver import NatsServer
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUICKSTART = REPO / "examples" / "quickstart.yaml"
WARMUP_STEPS = 20
STEP = 10  # every PolicyGroup's .status.step reaches this
VERSION = 5  # every rollout worker's heartbeat reports at least this weight version
TRAIN_TIMEOUT = 360.0  # measured: 90-100 s on a busy 2-core machine


def quickstart() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    policies = doc["spec"]["policies"]
    assert [p["name"] for p in policies] == ["solver", "verifier"]
    for policy in policies:  # both warm up: the solver on answers, the verifier on verdicts
        assert policy["trainer"]["warmupSteps"] > WARMUP_STEPS  # an override, not a no-op
        policy["trainer"]["warmupSteps"] = WARMUP_STEPS
    return doc


@dataclass
class Progress:
    """What the job has reached; true once it is far enough."""

    steps: dict[str, int] = field(default_factory=dict)  # PolicyGroup -> .status.step
    versions: dict[str, int] = field(default_factory=dict)  # rollout pod -> weight version
    policies_served: set[str] = field(default_factory=set)
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return (
            len(self.steps) == 2
            and all(step >= STEP for step in self.steps.values())
            and self.policies_served == {"solver", "verifier"}
            and all(version >= VERSION for version in self.versions.values())
        )


async def rollout_heartbeats(url: str, names: JobNames) -> list[Heartbeat]:
    """Every rollout heartbeat in the job's KV bucket (`<policy>.rollout.<pod>` keys)."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(names.heartbeats_bucket)
        beats = []
        for key in await kv.keys():
            if ".rollout." in key:
                entry = await kv.get(key)
                beats.append(Heartbeat.model_validate_json(entry.value or b""))
        return beats
    except (NotFoundError, KeyValueError):  # no bucket or no keys yet, or a key just expired
        return []
    finally:
        await nc.close()


def pods(kubectl: Kubectl, ns: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json(
        "get", "pods", "-n", ns, "-l", f"polyrl.dev/job={job}"
    )["items"]
    return items


def get_phase(kubectl: Kubectl, ns: str, job: str) -> str:
    phase: str = kubectl.json("get", "rlj", job, "-n", ns).get("status", {}).get("phase", "")
    return phase


def progress(
    kubectl: Kubectl, ns: str, job: str, url: str, logs: PodLogs, started: float
) -> Progress:
    logs.collect()
    failed = [
        p["metadata"]["name"]
        for p in pods(kubectl, ns, job)
        if p["status"].get("phase") == "Failed"
    ]
    assert not failed, f"pods failed: {failed}"
    groups = kubectl.json("get", "pg", "-n", ns)["items"]
    beats = asyncio.run(rollout_heartbeats(url, JobNames(namespace=ns, job=job)))
    return Progress(
        steps={g["metadata"]["name"]: g.get("status", {}).get("step", 0) for g in groups},
        versions={b.pod: b.weight_version for b in beats},
        policies_served={b.policy or "" for b in beats},
        seconds=round(time.monotonic() - started),
    )


def check_metrics(running: list[dict[str, Any]]) -> None:
    """Every pod's Prometheus metrics, scraped at its pod IP on its declared port twice, with
    Prometheus's own parser: each names its role, and the rollouts' counts move."""
    targets = {}
    for pod in running:
        [port] = [
            p["containerPort"]
            for p in pod["spec"]["containers"][0]["ports"]
            if p["name"] == "metrics"
        ]
        targets[pod["metadata"]["name"]] = f"http://{pod['status']['podIP']}:{port}/metrics"
    first = {name: scrape.worker_metrics(url) for name, url in targets.items()}
    served = "polyrl_worker_requests_served"

    def moved() -> dict[str, dict[str, float]] | None:
        now = {name: scrape.worker_metrics(url) for name, url in targets.items()}
        rollouts = [name for name in now if "-rollout-" in name]
        return now if all(now[n][served] > first[n][served] for n in rollouts) else None

    second = wait_until("every rollout pod's requests served to grow", moved, interval=1)
    for name, figures in second.items():
        assert figures["polyrl_worker_info"] == 1.0, name
        if "-rollout-" in name:
            assert (
                figures["polyrl_worker_requests_served"]
                > first[name]["polyrl_worker_requests_served"]
            )
            assert figures["polyrl_worker_sync_bytes"] > 0, name  # weights synced
            assert 0 <= figures["polyrl_worker_changed_fraction"] <= 1, name
        if "-trainer-" in name:
            assert figures["polyrl_worker_step"] >= STEP, name
            # every trained sample's age, one observation each
            assert figures["polyrl_worker_staleness_count"] > 0, name


def rolled_up(rljob: dict[str, Any]) -> bool:
    policies = rljob.get("status", {}).get("policies", [])
    return len(policies) == 2 and all(
        p.get("syncBytes", 0) > 0 and p.get("tokensPerSecond", 0) > 0 for p in policies
    )


def test_the_quickstart_trains_every_policy_syncs_its_rollouts_and_deletes_cleanly(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    doc = quickstart()
    job = doc["metadata"]["name"]
    logs = PodLogs(cluster, real_ns, tmp_path / "pod-logs")
    with explained(kubectl, operator, logs):
        kubectl("apply", "--validate=strict", "-n", real_ns, "-f", "-", input=yaml.safe_dump(doc))
        started = time.monotonic()
        reached = wait_until(
            f"every PolicyGroup at step >= {STEP} and every rollout at weight version >= {VERSION}",
            lambda: progress(kubectl, real_ns, job, nats_server.url, logs, started),
            timeout=TRAIN_TIMEOUT,
            interval=2,
        )
        print(f"trained: {reached}")
        assert set(reached.steps) == {f"{job}-solver", f"{job}-verifier"}
        assert set(reached.versions) == {f"{job}-solver-rollout-0", f"{job}-verifier-rollout-0"}
        for group in kubectl.json("get", "pg", "-n", real_ns)["items"]:
            # Both policies were evaluated after their warm-up (step 0), as their workflow
            # declares; the figure is the trainer's, in the PolicyGroup's status.
            held_out = group["status"].get("heldOut")
            assert isinstance(held_out, float | int), group["status"]
            assert 0 <= held_out <= 1
            # Progress of the policy's step budget, and a time left once the trainer has a pace.
            assert re.fullmatch(r"\d+/\d+ \(\d+%\)", group["status"]["progress"]), group["status"]
            assert re.fullmatch(r"(\d+[dhms]){1,2}", group["status"]["eta"]), group["status"]
            # How data and weights flow: the trainer's batch ages, the rollouts' last sync.
            flow = group["status"]
            assert 0 <= flow["stalenessP50"] <= flow["stalenessP95"], flow
            assert flow["syncBytes"] > 0, flow
            assert 0 <= flow["changedPercent"] <= 100, flow  # 0: a step that changed no bf16 bit
            assert flow["tokensPerSecond"] > 0, flow
            assert flow["queueDepth"] >= 0, flow
        wait_until(
            "the RLJob's per-policy figures rolled up from its groups",
            lambda: rolled_up(kubectl.json("get", "rlj", job, "-n", real_ns)),
            timeout=30,
        )
        running = pods(kubectl, real_ns, job)
        assert len(running) == 5  # 2 trainers, 2 rollouts, 1 workflow runner
        check_metrics(running)
        assert get_phase(kubectl, real_ns, job) == "Running"  # deleted while it trains

        kubectl("delete", "rlj", job, "-n", real_ns, "--timeout=120s")
        wait_until("the job's pods deleted", lambda: not pods(kubectl, real_ns, job), timeout=120)
        wait_no_pod_processes(logs)
