"""Fault injection on the test cluster, checked by a ledger of trajectory ids.

Real workers in exec-mode pods, the real operator and nats-server. Each case runs a short
job with `trainer.ledger` on, injects its fault, lets the job finish, then reconciles every
id the trajectory stream holds (what the workflow runner published) with the ids the
trainer's ledger says it trained or dropped (`polyrl.testing.ledger`): no id trained twice
except after a resume rolled its step back, none trained that was never published, and
what a resume re-trained bounded by checkpointEvery x batchSize per resume. Each case
prints its ledger; the module prints the table of all cases it ran.

The rollout kill and a preemption by Kueue run in `make test`; the other cases (trainer kills, runner kill, NATS
restart, a remote pool's link cut, a corrupted weights object, the operator killed in a scale
storm) are marked `chaos` (`make test-chaos`). docs/reliability.md has the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import re
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.js.errors
import pytest
import yaml
from nats.js import JetStreamContext
from tests.operator_stack import PodLogs, explained, pod_processes

from polyrl.api import naming
from polyrl.api.naming import JobNames
from polyrl.api.queueing import PRIORITY_LABEL, QUEUE_LABEL
from polyrl.bench.dataplane import stream_ids
from polyrl.bench.netshape import ShapedProxy
from polyrl.local.natsserver import NatsServer
from polyrl.testing import ledger
from polyrl.testing.cluster import Cluster
from polyrl.testing.kube import Kubectl, condition
from polyrl.testing.kueue import MANAGED_LABEL, Kueue, queues
from polyrl.testing.operatorprocess import OperatorProcess
from polyrl.testing.waiting import wait_until
from polyrl.workers.weightsync.chain import delta_name
from polyrl.workers.weightsync.store import WeightStore

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BATCH = 16
TABLE: dict[str, ledger.Account] = {}
RECOVERY: dict[str, str] = {}  # per case: how long until the job was whole again, and what
T = TypeVar("T")


@pytest.fixture(scope="module", autouse=True)
def suite_table() -> Iterator[None]:
    yield
    if TABLE:
        print(
            "\nfault-injection suite, trajectory ledger per case:\n"
            + ledger.table(TABLE, {"recovery": RECOVERY})
        )


def job(
    name: str,
    *,
    steps: int | None = None,
    checkpoint_every: int = 50,
    replicas: int = 2,
    keyframe_every: int = 20,
) -> dict[str, Any]:
    """A one-policy job on a tiny model: `steps` long, or, without, until `Case.stop_now`."""
    return {
        "apiVersion": "polyrl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "policies": [
                {
                    "name": "solver",
                    "model": {"path": f"tiny-llama://chaos-{name}"},
                    "trainer": {
                        "batchSize": BATCH,
                        "microBatchSize": BATCH,
                        "checkpointEvery": checkpoint_every,
                        "checkpoint": {"size": "1Gi"},
                        "ledger": True,
                        "restartLimit": 10,
                    },
                    "rollout": {"replicas": replicas, "maxBatchSize": 16},
                    "keyframeEvery": keyframe_every,
                }
            ],
            "workflow": {
                "name": "single",
                "episodesInFlight": 4,
                "task": {"params": {"digits": 1}},
            },
            "algorithm": {"groupSize": 4, "maxNewTokens": 3},
            "stop": {"steps": steps} if steps else {"durationSeconds": 3600},
        },
    }


class Case:
    """One job on the cluster: its status, its pods' processes, and its ledger at the end."""

    def __init__(
        self, kubectl: Kubectl, ns: str, name: str, logs: PodLogs, nats_server: NatsServer
    ) -> None:
        self.kubectl, self.ns, self.name, self.logs = kubectl, ns, name, logs
        self.nats_url = nats_server.url

    def status(self, kind: str, name: str) -> dict[str, Any]:
        got = self.kubectl("get", kind, name, "-n", self.ns, "-o", "json", check=False)
        return json.loads(got.stdout).get("status", {}) if got.returncode == 0 else {}

    def step(self) -> int:
        self.logs.collect()
        return int(self.status("pg", f"{self.name}-solver").get("step", 0))

    def wait_step(self, step: int) -> None:
        wait_until(
            f"{self.name} at step {step}", lambda: self.step() >= step, timeout=240, interval=1
        )

    def processes_of(self, pod: str) -> list[int]:
        found = []
        for pid in pod_processes(self.logs):
            with contextlib.suppress(OSError):
                if f"POLYRL_POD_NAME={pod}\0".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    found.append(pid)
        return found

    def wait_processes_gone(self, timeout: float = 60) -> None:
        """Until no process of any of the job's pods runs (evicted, suspended)."""
        wait_until(
            "every process of the job's pods gone",
            lambda: not any(self.processes_of(p) for p in self.pod_uids()),
            timeout=timeout,
            interval=0.5,
        )

    def kill(self, pod: str) -> int:
        """SIGKILL the pod's processes (by PID, found by the sandbox the node agent made),
        once it has some: a pod being replaced has none for a while."""
        mine = wait_until(f"a process of pod {pod}", lambda: self.processes_of(pod), timeout=120)
        for pid in mine:
            os.kill(pid, signal.SIGKILL)
        return len(mine)

    def trains_on(self, step: int, since: float, case_name: str, after: str) -> float:
        """Seconds from `since` until the trainer is two steps past `step`; noted for the table."""
        wait_until("training going on", lambda: self.step() >= step + 2, timeout=240, interval=0.5)
        seconds = time.monotonic() - since
        RECOVERY[case_name] = f"{seconds:.1f} s to train 2 more steps after {after}"
        return seconds

    def stop_now(self) -> None:
        """End a job that runs until stopped, as a user would: a stop condition already met."""
        patch = json.dumps({"spec": {"stop": {"durationSeconds": 1}}})
        self.kubectl("patch", "rlj", self.name, "-n", self.ns, "--type=merge", "-p", patch)

    def pod_uids(self) -> dict[str, str]:
        """Every pod of the job by name, with its UID (a replaced pod has a new one)."""
        found = self.kubectl.json("get", "pods", "-n", self.ns, "-l", f"{naming.L_JOB}={self.name}")
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in found["items"]}

    def version(self) -> int:
        """The trainer's latest announced weight version."""
        return asyncio.run(self._nats(self._latest_version))

    def beat(self, pod: str) -> dict[str, Any]:
        """A rollout pod's last heartbeat ({} before its first)."""
        return asyncio.run(self._nats(lambda js: self._beat(js, pod)))

    def log_of(self, pod: str) -> str:
        """What the pod's container wrote so far (its live log in the node agent's sandbox)."""
        return "".join(
            log.read_text(errors="replace")
            for log in sorted(self.logs.root.glob(f"{self.ns}_{pod}_*/*.log"))
        )

    async def _nats(self, use: Callable[[JetStreamContext], Awaitable[T]]) -> T:
        nc = await nats.connect(self.nats_url)
        try:
            return await use(nc.jetstream())
        finally:
            await nc.close()

    async def _latest_version(self, js: JetStreamContext) -> int:
        names = JobNames(namespace=self.ns, job=self.name)
        try:
            msg = await js.get_last_msg(
                names.weights_stream("solver"), names.weights_subject("solver")
            )
        except nats.js.errors.NotFoundError:
            return -1
        return int(json.loads(msg.data or b"{}")["version"])

    async def _beat(self, js: JetStreamContext, pod: str) -> dict[str, Any]:
        kv = await js.key_value(JobNames(namespace=self.ns, job=self.name).heartbeats_bucket)
        try:
            entry = await kv.get(JobNames.heartbeat_key("solver", "rollout", pod))
        except nats.js.errors.KeyNotFoundError:
            return {}
        found: dict[str, Any] = json.loads(entry.value or b"{}")
        return found

    def finish(self) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            self.logs.collect()
            found = self.kubectl.json("get", "rlj", self.name, "-n", self.ns)
            return (
                found if found.get("status", {}).get("phase") in ("Succeeded", "Failed") else None
            )

        done: dict[str, Any] = wait_until(f"{self.name} to end", ended, timeout=300, interval=1)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        return done

    async def runner_beat(self, names: JobNames) -> dict[str, Any]:
        """The workflow runner's last heartbeat (kept a minute after it stopped)."""
        nc = await nats.connect(self.nats_url)
        try:
            kv = await nc.jetstream().key_value(names.heartbeats_bucket)
            entry = await kv.get(
                JobNames.heartbeat_key(None, "workflow", f"{self.name}-workflow-0")
            )
            beat: dict[str, Any] = json.loads(entry.value or b"{}")
            return beat
        finally:
            await nc.close()

    def entries(self) -> list[ledger.Entry]:
        """The trainer's ledger so far, read from its checkpoint claim's volume."""
        uid = self.kubectl.json("get", "rlj", self.name, "-n", self.ns)["metadata"]["uid"]
        got = self.kubectl(
            "get",
            "pvc",
            f"{self.name}-solver-checkpoints",
            "-n",
            self.ns,
            "-o",
            "json",
            check=False,
        )
        claim = json.loads(got.stdout) if got.returncode == 0 else {}
        if not claim.get("spec", {}).get("volumeName"):
            return []
        pv = self.kubectl.json("get", "pv", claim["spec"]["volumeName"])
        workdir = Path(pv["spec"]["hostPath"]["path"]) / uid / self.ns / self.name / "solver"
        path = workdir / "ledger.jsonl"
        return ledger.read(path) if path.is_file() else []

    def ledger(self) -> ledger.Account:
        entries = self.entries()
        names = JobNames(namespace=self.ns, job=self.name)
        published = asyncio.run(self._published(names))
        return ledger.account(published, entries)

    async def _published(self, names: JobNames) -> list[str]:
        nc = await nats.connect(self.nats_url)
        try:
            return await stream_ids(nc.jetstream(), names.trajectories_subject("solver"))
        finally:
            await nc.close()


@dataclass(frozen=True)
class Stack:
    """What every case runs on: the cluster, the operator, NATS, a namespace whose pods run
    the real workers, and a directory of its own."""

    kubectl: Kubectl
    ns: str
    operator: OperatorProcess
    cluster: Cluster
    nats_server: NatsServer
    tmp_path: Path


@pytest.fixture
def stack(
    kubectl: Kubectl,
    real_ns: str,
    operator: OperatorProcess,
    cluster: Cluster,
    nats_server: NatsServer,
    tmp_path: Path,
) -> Stack:
    return Stack(kubectl, real_ns, operator, cluster, nats_server, tmp_path)


def run_case(
    case_name: str, stack: Stack, doc: dict[str, Any], inject: Callable[[Case], None]
) -> ledger.Account:
    kubectl, ns, nats_server = stack.kubectl, stack.ns, stack.nats_server
    name = doc["metadata"]["name"]
    logs = PodLogs(stack.cluster, ns, stack.tmp_path / "pod-logs")
    case = Case(kubectl, ns, name, logs, nats_server)
    case.nats_url = doc["spec"].get("nats", {}).get("url") or nats_server.url
    with explained(kubectl, stack.operator, logs):
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
        started = time.monotonic()
        inject(case)
        case.finish()
        acc = case.ledger()
        runner = asyncio.run(case.runner_beat(JobNames(namespace=ns, job=name)))
    print(f"{case_name}: {time.monotonic() - started:.0f}s, ledger {json.dumps(acc.row())}")
    TABLE[case_name] = acc
    assert acc.faults == 0, (acc.trained_twice[:5], acc.never_published[:5])
    assert acc.accounted == acc.published
    assert runner.get("failed_episodes", 0) == 0, runner  # no episode failed
    return acc


PRIORITIES = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {name: polyrl-low}
value: 10
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {name: polyrl-high}
value: 1000
"""


@pytest.mark.kueue
def test_a_job_preempted_by_kueue_checkpoints_and_resumes_losing_no_step(
    stack: Stack, kueue: Kueue
) -> None:
    """A low-priority job's gang (runner, trainer, 2 rollouts: 4 CPUs, the whole quota) is
    preempted by a job of higher priority (3 CPUs): Kueue deletes its pods (the trainer saves
    on SIGTERM), the operator makes them again behind the gate, the job waits while the other
    runs, and once that one finishes it is admitted again and resumes from the checkpoint at
    the step it stopped."""
    kubectl, ns = stack.kubectl, stack.ns
    kubectl("label", "namespace", ns, f"{MANAGED_LABEL}=true")
    kubectl.apply(PRIORITIES + "---" + queues(ns, cpu=4, preemption=True))
    doc = job("preempt")  # until stopped: a tiny model runs 12 steps in a second
    doc["metadata"]["labels"] = {QUEUE_LABEL: "work", PRIORITY_LABEL: "polyrl-low"}
    doc["spec"]["policies"][0]["rollout"]["minReplicas"] = 2
    urgent = job("urgent", steps=3, replicas=1)  # runner, trainer, 1 rollout: 3 CPUs
    urgent["metadata"]["labels"] = {QUEUE_LABEL: "work", PRIORITY_LABEL: "polyrl-high"}
    urgent["spec"]["policies"][0]["rollout"]["minReplicas"] = 1
    timings: dict[str, float] = {}

    def said(name: str, kind: str) -> str | None:
        return condition(kubectl.json("get", "rlj", name, "-n", ns), kind)

    def inject(case: Case) -> None:
        case.wait_step(3)
        started = time.monotonic()
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(urgent))
        wait_until(
            "the job Suspended (Preempted)",
            lambda: said(case.name, "Suspended") == "True",
            timeout=60,
        )
        evicted = time.monotonic()
        timings["evicted"] = evicted - started  # the operator made its pods; Kueue preempted
        case.wait_processes_gone()
        timings["suspend"] = time.monotonic() - evicted
        wait_until(
            "the urgent job admitted", lambda: said("urgent", "Admitted") == "True", timeout=60
        )
        # It waits while the urgent one runs (the operator says so at its next status pass).
        wait_until(
            "the preempted job not admitted while the urgent one runs",
            lambda: said(case.name, "Admitted") == "False",
            timeout=30,
        )
        assert said("urgent", "Admitted") == "True"
        Case(kubectl, ns, "urgent", case.logs, stack.nats_server).finish()
        timings["urgent"] = time.monotonic() - started
        wait_until(
            "the job admitted again once the urgent one finished",
            lambda: said(case.name, "Admitted") == "True",
            timeout=120,
        )
        timings["readmit"] = time.monotonic() - started
        at = case.step()
        case.wait_step(at + 3)  # trains on from its checkpoint
        case.stop_now()
        RECOVERY["Kueue preemption"] = (
            f"evicted {timings['evicted']:.1f} s after a job of higher priority was applied, "
            f"every pod gone {timings['suspend']:.1f} s later; admitted again at "
            f"{timings['readmit']:.1f} s (the other job ran 3 steps, done at "
            f"{timings['urgent']:.1f} s)"
        )

    acc = run_case("Kueue preemption", stack, doc, inject)
    group = stack.kubectl.json("get", "pg", "preempt-solver", "-n", ns)["status"]
    assert group.get("trainerRestarts", 0) == 0  # a preemption is no failure of the trainer
    assert timings["suspend"] < 60
    assert timings["urgent"] < timings["readmit"]
    assert acc.resumes >= 1
    assert acc.retrained_after_resume + acc.only_rolled_back == 0  # no step was lost


@pytest.mark.chaos
@pytest.mark.kueue
def test_a_queued_job_suspended_by_its_user_frees_its_quota_and_resumes_losing_no_step(
    stack: Stack, kueue: Kueue
) -> None:
    """`kubectl patch rljob --type=merge -p '{"spec":{"suspend":true}}'` on a job Kueue
    admitted: every pod goes (the trainer saves on SIGTERM), Kueue's Workload finishes and
    frees the quota; resumed, the job is a new Workload, admitted again, and trains on from
    its checkpoint."""
    kubectl, ns = stack.kubectl, stack.ns
    kubectl("label", "namespace", ns, f"{MANAGED_LABEL}=true")
    kubectl.apply(queues(ns, cpu=4))
    doc = job("usersuspend")  # until stopped
    doc["metadata"]["labels"] = {QUEUE_LABEL: "work"}
    timings: dict[str, float] = {}

    def said(kind: str) -> str | None:
        return condition(kubectl.json("get", "rlj", "usersuspend", "-n", ns), kind)

    def suspend(value: bool) -> None:
        patch = json.dumps({"spec": {"suspend": value}})
        kubectl("patch", "rlj", "usersuspend", "-n", ns, "--type=merge", "-p", patch)

    def inject(case: Case) -> None:
        case.wait_step(3)
        started = time.monotonic()
        suspend(True)
        case.wait_processes_gone()
        timings["gone"] = time.monotonic() - started
        wait_until("the job not admitted", lambda: said("Admitted") == "False", timeout=60)
        suspend(False)
        resumed = time.monotonic()
        wait_until("the job admitted again", lambda: said("Admitted") == "True", timeout=120)
        timings["readmit"] = time.monotonic() - resumed
        at = case.step()
        case.wait_step(at + 3)  # trains on from its checkpoint
        case.stop_now()
        RECOVERY["user suspension (queued)"] = (
            f"every pod gone {timings['gone']:.1f} s after the patch; admitted again "
            f"{timings['readmit']:.1f} s after resuming"
        )

    acc = run_case("user suspension (queued)", stack, doc, inject)
    assert timings["gone"] < 60
    assert acc.resumes >= 1
    assert acc.retrained_after_resume + acc.only_rolled_back == 0  # no step was lost


def test_a_rollout_pod_killed_mid_generation_loses_no_episode_and_no_sample(
    stack: Stack,
) -> None:
    def inject(case: Case) -> None:
        case.wait_step(3)
        step, killed = case.step(), time.monotonic()
        case.kill(f"{case.name}-solver-rollout-0")
        case.trains_on(step, killed, "rollout SIGKILL", "the kill")
        trained.append(case.step())
        case.stop_now()  # runs until stopped: a tiny model can finish a fixed length in a second

    trained: list[int] = []
    acc = run_case("rollout SIGKILL", stack, job("rkill"), inject)
    assert acc.resumes == 0
    assert acc.trained_once >= trained[0] * BATCH


@pytest.mark.chaos
def test_a_trainer_killed_mid_step_three_times_resumes_each_time_and_loses_nothing(
    stack: Stack,
) -> None:
    kills = 3

    back: list[float] = []

    def inject(case: Case) -> None:
        killed = 0.0
        for epoch in range(kills + 1):  # each trainer trains two steps of its epoch, then dies
            wait_until(
                f"epoch {epoch} to train two steps",
                lambda: sum(e.epoch == epoch for e in case.entries()) >= 2,  # noqa: B023
                timeout=240,
                interval=0.5,
            )
            if epoch:
                back.append(time.monotonic() - killed)
            if epoch < kills:
                killed = time.monotonic()
                case.kill(f"{case.name}-solver-trainer-0")
        RECOVERY["trainer SIGKILL x3"] = (
            f"{max(back):.1f} s at most from a kill to the resumed trainer's second step"
        )

    acc = run_case("trainer SIGKILL x3", stack, job("tkill", steps=14), inject)
    assert acc.resumes == kills
    # what resumes re-trained is bounded by checkpointEvery x batchSize per resume (default 50)
    assert acc.retrained_after_resume + acc.only_rolled_back <= kills * 50 * BATCH


@pytest.mark.chaos
def test_a_workflow_runner_killed_mid_episode_is_replaced_and_the_job_goes_on(
    stack: Stack,
) -> None:
    def inject(case: Case) -> None:
        case.wait_step(3)
        killed, at = time.monotonic(), time.time()
        case.kill(f"{case.name}-workflow-0")
        names = JobNames(namespace=case.ns, job=case.name)

        def replaced_and_working() -> bool:  # the new runner's own heartbeat, an episode done
            beat = asyncio.run(case.runner_beat(names))
            return bool(beat.get("at", 0) > at and beat.get("requests_served", 0) > 0)

        wait_until("the replacement runner's first episode", replaced_and_working, timeout=240)
        RECOVERY["runner SIGKILL"] = (
            f"{time.monotonic() - killed:.1f} s from the kill to the new runner's first episode"
        )

    acc = run_case("runner SIGKILL", stack, job("wkill", steps=30), inject)
    assert acc.trained_once >= 30 * BATCH


@pytest.mark.chaos
def test_nats_stopped_and_restarted_mid_run_every_worker_reconnects_and_the_job_finishes(
    stack: Stack,
) -> None:
    steps = 150
    with NatsServer(stack.tmp_path / "own-nats") as own:  # file storage, kept across the restart
        doc = job("nrestart", steps=steps)
        doc["spec"]["nats"] = {"url": own.url}

        def inject(case: Case) -> None:
            case.wait_step(3)
            pods, step, stopped = case.pod_uids(), case.step(), time.monotonic()
            own.restart(down_seconds=5)
            case.trains_on(step, stopped, "nats-server restart", "the server stopped (5 s down)")
            assert step < steps - 5  # the restart came in the middle of it
            # every worker rode it out in the pod it was in: nothing was replaced
            assert case.pod_uids() == pods

        acc = run_case("nats-server restart", stack, doc, inject)
        stack.kubectl("delete", "rlj", "nrestart", "-n", stack.ns)  # while its NATS still runs
    assert acc.resumes == 0  # the trainer never restarted
    assert acc.trained_once >= steps * BATCH


class Link:
    """A `ShapedProxy` to the test's nats-server on a loop of its own thread: the link a
    remote pool reaches NATS through, which the test can cut and heal."""

    def __init__(self, port: int) -> None:
        self.proxy = ShapedProxy("127.0.0.1", port, rate_bits=1e9, rtt=0.02)  # a regional link
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="link", daemon=True)

    def __enter__(self) -> Link:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.__aenter__(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()
        asyncio.run_coroutine_threadsafe(self.proxy.__aexit__(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @property
    def url(self) -> str:
        return self.proxy.url

    def cut(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.cut)

    def heal(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.heal)


def capacity_group(job: str, name: str, *, replicas: int, nats_url: str) -> dict[str, Any]:
    """A PolicyGroup a user applies to add rollout capacity elsewhere (no trainer)."""
    return {
        "apiVersion": "polyrl.dev/v1alpha1",
        "kind": "PolicyGroup",
        "metadata": {"name": name},
        "spec": {
            "jobRef": job,
            "policy": "solver",
            "rollout": {"replicas": replicas, "maxBatchSize": 16},
            "natsUrl": nats_url,
        },
    }


@pytest.mark.chaos
def test_a_remote_pool_cut_off_for_30_s_serves_only_announced_weights_and_the_latest_soon_after(
    stack: Stack,
) -> None:
    keyframe_every, cut_seconds = 20, 30.0
    remote = "cut-remote-rollout-0"
    seen: list[tuple[int, int]] = []  # (the remote's version, the latest announced after it)
    announced: list[tuple[float, int]] = []  # (unix time, the latest version then)
    after_heal: dict[str, float] = {}

    def watch(case: Case, until: Callable[[], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not until():
            if (version := case.beat(remote).get("weight_version")) is not None:
                seen.append((version, case.version()))  # read after the replica's word
            announced.append((time.time(), case.version()))
            time.sleep(0.5)

    with Link(stack.nats_server.port) as link:

        def inject(case: Case) -> None:
            doc = capacity_group(case.name, "cut-remote", replicas=1, nats_url=link.url)
            stack.kubectl("apply", "-n", case.ns, "-f", "-", input=yaml.safe_dump(doc))
            wait_until(
                "the remote replica serving through its link",
                lambda: case.beat(remote).get("requests_served", 0) > 0,
                timeout=180,
            )
            link.cut()
            before = case.version()
            watch(case, lambda: False, cut_seconds)
            assert case.version() > before  # the home pool kept the job training
            link.heal()
            healed_at, healed_version = time.time(), case.version()

            def caught_up() -> bool:  # serving what was the latest when the link came back
                return int(case.beat(remote).get("weight_version", -1)) >= healed_version

            watch(case, caught_up, 120)
            assert caught_up()
            announced.append((time.time(), case.version()))  # now, after it said so
            # When, by its own log, it first served that version; what had come out by then.
            served_at = first_served(case.log_of(remote), healed_version)
            after_heal["seconds"] = served_at - healed_at
            after_heal["versions"] = (
                next(v for t, v in announced if t >= served_at) - healed_version
            )
            RECOVERY["remote pool cut 30 s"] = (
                f"{after_heal['seconds']:.1f} s after the heal to serve the version then latest"
                f" ({after_heal['versions']:.0f} versions published meanwhile)"
            )
            print(
                f"remote pool cut {cut_seconds:.0f}s from version {before}: serving the latest"
                f" {after_heal['seconds']:.1f}s, {after_heal['versions']:.0f} versions after the heal"
            )
            case.stop_now()

        acc = run_case(
            "remote pool cut 30 s",
            stack,
            job("cut", replicas=1, keyframe_every=keyframe_every),
            inject,
        )
    # never a version ahead of what was announced, never going back
    assert seen
    assert all(version <= announced for version, announced in seen)
    versions = [version for version, _ in seen]
    assert versions == sorted(versions)
    # Soon after, in time: how many versions come out meanwhile depends on how fast the home
    # pool trains, and the remote's delayed answers arriving at once after the heal can make
    # several steps a second (23 versions in 1.5 s, once), so that count is reported only.
    assert after_heal["seconds"] <= 10.0
    assert acc.trained_once > 0


@pytest.mark.chaos
def test_a_corrupt_object_in_the_weights_bucket_is_refused_by_every_replica_that_reads_it(
    stack: Stack,
) -> None:
    """Two of three replicas are frozen (SIGSTOP) so that they will read what the test
    damages: the delta after the version each holds, and the one after that (it may have
    fetched the first before it froze). The trainer goes on with the third replica."""
    keyframe_every = 5
    frozen = ["corrupt-solver-rollout-1", "corrupt-solver-rollout-2"]
    damaged: list[str] = []
    held: dict[str, int] = {}

    def inject(case: Case) -> None:
        case.wait_step(3)
        wait_until("every replica serving", lambda: all(case.beat(p) for p in frozen), timeout=120)
        pids = {pod: case.processes_of(pod) for pod in frozen}
        for pid in (pid for found in pids.values() for pid in found):
            os.kill(pid, signal.SIGSTOP)
        try:
            # Frozen (state T): what a replica logged before, it wrote to its log file itself.
            wait_until(
                "the frozen replicas' processes stopped",
                lambda: all(stopped(pid) for found in pids.values() for pid in found),
            )
            held.update({pod: served_version(case.log_of(pod)) for pod in frozen})
            last = max(held.values()) + 2
            # past the damaged deltas and on to a keyframe, so a resync has a sound path
            beyond = (last // keyframe_every + 1) * keyframe_every
            wait_until(f"version {beyond}", lambda: case.version() >= beyond, timeout=180)
            for version in sorted({v + i for v in held.values() for i in (0, 1)}):
                damaged.append(asyncio.run(case._nats(lambda js: damage(js, case, version))))  # noqa: B023
        finally:
            for pid in (pid for found in pids.values() for pid in found):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        resumed, thawed = case.version(), time.monotonic()
        wait_until(
            "each thawed replica refusing what it read and serving the latest again",
            lambda: all(
                (b := case.beat(p)).get("weights_refused", 0) >= 1
                and b.get("weight_version", -1) >= resumed
                for p in frozen
            ),
            timeout=120,
        )
        RECOVERY["weights object corrupted"] = (
            f"{time.monotonic() - thawed:.1f} s from the thaw to both readers serving the latest"
        )
        wait_until("the trainer publishing on", lambda: case.version() > resumed, timeout=60)
        case.stop_now()

    acc = run_case(
        "weights object corrupted",
        stack,
        job("corrupt", replicas=3, keyframe_every=keyframe_every),
        inject,
    )
    print(f"held {held}; damaged {damaged}")
    assert acc.trained_once > 0


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc/<pid>/stat)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def first_served(log: str, version: int) -> float:
    """Unix time of the rollout worker's first log line saying it serves `version` or later."""
    for stamp, served in re.findall(
        r"^(\S+ \S+) INFO polyrl.rollout: serving weight version (\d+)", log, re.M
    ):
        if int(served) >= version:
            when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
            return when.astimezone().timestamp()  # the worker logs local time
    raise AssertionError(f"the replica never said it serves version {version}")


def served_version(log: str) -> int:
    """The weight version a rollout worker last said it serves."""
    found = re.findall(r"serving weight version (\d+)", log)
    assert found, "the replica never said which weights it serves"
    return int(found[-1])


async def damage(js: JetStreamContext, case: Case, version: int) -> str:
    """Flip a bit in the stored delta `version -> version + 1`, in place in the bucket (its
    chunks rewritten, its metadata untouched): what a bad disk or a stray writer leaves."""
    names = JobNames(namespace=case.ns, job=case.name)
    store = await WeightStore.open(js, names.weights_bucket("solver"))
    try:
        name = delta_name(version, version + 1)
        meta = await store.meta(name)
        blob = bytearray(await store.get(name))
        blob[len(blob) // 2] ^= 0x10
        subject = f"$O.{store.bucket}.C.{meta.nuid}"
        await js.purge_stream(store.stream, subject=subject)
        for start in range(0, len(blob), store.chunk_size):
            await js.publish(subject, bytes(blob[start : start + store.chunk_size]))
        return name
    finally:
        await store.close()


@pytest.mark.chaos
def test_the_operator_killed_during_a_scale_storm_leaves_the_exact_count_and_nothing_draining(
    stack: Stack,
) -> None:
    group = "storm-solver"
    settled: dict[str, Any] = {}
    seen: dict[str, list[str]] = {}  # the pool at each fault, as `pool` describes it

    def rollouts(case: Case) -> list[dict[str, Any]]:
        """The group's rollout pods, those on their way out included."""
        found: list[dict[str, Any]] = stack.kubectl.json(
            "get", "pods", "-n", case.ns, "-l", f"{naming.L_GROUP}={group},{naming.L_ROLE}=rollout"
        )["items"]
        return found

    def leaving(p: dict[str, Any]) -> bool:
        meta = p["metadata"]
        return bool(meta.get("deletionTimestamp")) or naming.L_DRAINING in meta["labels"]

    def active(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [p for p in pods if not leaving(p)]

    def state(p: dict[str, Any]) -> str:
        if leaving(p):
            return "leaving"
        return "ready" if condition(p, "Ready") == "True" else "starting"

    def pool(pods: list[dict[str, Any]]) -> list[str]:
        return sorted(f"{p['metadata']['name']}:{state(p)}" for p in pods)

    def acted(case: Case, count: int) -> list[dict[str, Any]] | None:
        """The pool once the operator left `count` active pods (the rest on their way out)."""
        pods = rollouts(case)
        return pods if len(active(pods)) == count else None

    def scale(case: Case, replicas: int) -> None:
        stack.kubectl("scale", "pg", group, "-n", case.ns, f"--replicas={replicas}")

    def inject(case: Case) -> None:
        case.wait_step(2)
        # Up to 8, and back to 2 while the new pods still start.
        scale(case, 8)
        grown = wait_until("8 rollout pods", lambda: acted(case, 8), timeout=60)
        seen["scaled down to 2 while"] = pool(grown)
        assert any(state(p) == "starting" for p in grown), pool(grown)
        scale(case, 2)
        # The operator killed while the six it let go are still on their way out.
        shrinking = wait_until("2 rollout pods staying", lambda: acted(case, 2), timeout=60)
        stack.operator.kill()
        seen["operator killed while"] = pool(shrinking)
        assert len(active(shrinking)) == 2
        assert any(leaving(p) for p in shrinking), pool(shrinking)
        # Scaled to 6 while no operator runs: nobody acts on it.
        scale(case, 6)
        assert stack.operator.proc is None
        assert len(active(rollouts(case))) == 2
        # Then to 0, and to 3 while the restarted operator takes the pool down to 0.
        scale(case, 0)
        stack.operator.start()
        started = time.monotonic()
        emptying = wait_until("no rollout pod staying", lambda: acted(case, 0), timeout=60)
        scale(case, 3)
        seen["scaled up to 3 while"] = pool(emptying)
        assert any(leaving(p) for p in emptying), pool(emptying)

        def exactly_three() -> list[dict[str, Any]] | None:
            pods = [p for p in rollouts(case) if not p["metadata"].get("deletionTimestamp")]
            status = case.status("pg", group)
            ok = (
                len(pods) == 3
                and all(p["status"].get("phase") == "Running" for p in pods)
                and not any(naming.L_DRAINING in p["metadata"]["labels"] for p in pods)
                and status.get("replicas") == status.get("readyReplicas") == 3
            )
            return pods if ok else None

        pods = wait_until("exactly 3 ready rollouts, none draining", exactly_three, timeout=180)
        settled["seconds"] = time.monotonic() - started
        # And it stays so: later passes create and delete nothing.
        groups = stack.kubectl.json("get", "pg", "--all-namespaces")["items"]
        stack.operator.wait_passes("policygroup", 2 * len(groups))
        again = exactly_three()
        assert again is not None
        assert {p["metadata"]["uid"] for p in again} == {p["metadata"]["uid"] for p in pods}
        indices = [int(p["metadata"]["labels"][naming.L_REPLICA]) for p in pods]
        assert len(set(indices)) == 3, indices
        assert sorted(p["metadata"]["name"] for p in pods) == [
            f"{group}-rollout-{i}" for i in sorted(indices)
        ]
        settled["indices"] = sorted(indices)
        RECOVERY["operator SIGKILL in a scale storm"] = (
            f"{settled['seconds']:.1f} s from the operator's restart to 3 ready, none draining"
        )
        version = case.version()
        wait_until(
            "training on with the new pool", lambda: case.version() > version + 2, timeout=60
        )
        case.stop_now()

    acc = run_case("operator SIGKILL in a scale storm", stack, job("storm", replicas=1), inject)
    for when, states in seen.items():
        print(f"scale storm: {when} {' '.join(states)}")
    assert acc.trained_once > 0
