"""The local runner stops consumers before what they consume: workflow, rollouts, a frozen
policy's publisher, trainers."""

from __future__ import annotations

import sys
from pathlib import Path

from polyrl.api.launch import Role
from polyrl.local import jobfile, processes, runner
from polyrl.local.runner import LocalRun
from polyrl.testing.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]

# Notes the time it got SIGTERM, then takes a moment to exit, as a draining worker would.
WORKER = """
import signal, sys, time
def stop(signum, frame):
    with open(sys.argv[1], "a") as out:
        out.write(f"{time.time()}\\n")
    time.sleep(0.3)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_stop_lets_the_workflow_finish_before_rollouts_and_trainers_get_sigterm(
    tmp_path: Path,
) -> None:
    job = jobfile.load(REPO / "examples" / "quickstart.yaml")
    run = LocalRun(job=job, run_dir=tmp_path)
    for role in (Role.TRAINER, Role.PUBLISHER, Role.ROLLOUT, Role.WORKFLOW):  # the other order
        log = tmp_path / f"{role}.log"
        run.procs[str(role)] = processes.start(
            str(role), [sys.executable, "-c", WORKER, str(tmp_path / f"{role}.stopped")], log=log
        )
        run.roles[str(role)] = role
        wait_until(f"the {role} to say ready", lambda: "ready" in log.read_text())  # noqa: B023
    run.stop()
    assert not any(proc.alive() for proc in run.procs.values())
    stopped = {role: float((tmp_path / f"{role}.stopped").read_text()) for role in run.roles}
    order = sorted(stopped, key=stopped.__getitem__)
    assert order == [str(role) for role in runner.STOP_ORDER]
    # each got SIGTERM only once the one before had exited
    assert stopped["rollout"] - stopped["workflow"] >= 0.25
    assert stopped["publisher"] - stopped["rollout"] >= 0.25
    assert stopped["trainer"] - stopped["publisher"] >= 0.25


def test_a_failed_process_is_reported_with_its_termination_message_or_its_logs_end(
    tmp_path: Path,
) -> None:
    job = jobfile.load(REPO / "examples" / "quickstart.yaml")
    run = LocalRun(job=job, run_dir=tmp_path)
    said = run.termination_log("said")
    said.parent.mkdir(parents=True)
    script = f"open({str(said)!r}, 'w').write('invalid input: unknown task x\\\\n'); exit(2)"
    run.procs["said"] = processes.start(
        "said", [sys.executable, "-c", script], log=tmp_path / "said.log"
    )
    crash = "print('loading'); raise RuntimeError('boom')"
    run.procs["crash"] = processes.start(
        "crash", [sys.executable, "-c", crash], log=tmp_path / "crash.log"
    )
    for proc in run.procs.values():
        assert proc.popen is not None
        proc.popen.wait(timeout=30)
    failed = "\n".join(run.failed())
    assert "said exited 2: invalid input: unknown task x" in failed
    assert "crash exited 1: " in failed
    assert "RuntimeError: boom" in failed  # the end of its log, where it left no message
