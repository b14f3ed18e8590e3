"""Running one pod's containers as local processes (exec mode), one thread per pod.

The thread owns the pod's processes from start to final status. Init containers run in
order to completion first; then every container starts, and each exit is reported at once.
Under `restartPolicy: Never` the pod ends Succeeded when every container exited 0, else
Failed; under `Always`/`OnFailure` an exited container is restarted with a doubling backoff
(1 s up to 30 s), like CrashLoopBackOff. `terminate()` is graceful deletion: SIGTERM to each
process group, SIGKILL after the grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from polyrl.testing.nodeagent import podenv, podstatus
from polyrl.testing.nodeagent.podstatus import ContainerState

log = logging.getLogger("polyrl.nodeagent")

PatchStatus = Callable[[dict[str, Any]], None]
MAX_BACKOFF = 30.0


def _path() -> str:
    """The agent's PATH with its own interpreter's directory first, so a pod's `polyrl`,
    `torchrun` or `python` is the virtualenv's, however the agent itself was started."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


class PodRunner:
    def __init__(
        self,
        pod: Mapping[str, Any],
        *,
        sandbox: Path,
        lookup: podenv.Lookup,
        patch_status: PatchStatus,
    ) -> None:
        self.pod = pod
        self.sandbox = sandbox
        self.lookup = lookup
        self.patch_status = patch_status
        self.states = podstatus.containers_of(pod)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.start_time = podstatus.stamp()
        self.stopping = threading.Event()
        self.done = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.key}", daemon=True)

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            self.sandbox.mkdir(parents=True, exist_ok=True)
            if not self._run_init_containers():
                return
            self._run_containers()
        except Exception as err:  # the agent must outlive any one pod
            log.exception("pod %s: runner failed", self.key)
            self._report("Failed", reason="NodeAgentError", message=str(err))
        finally:
            # When stopping, terminate() owns the processes and their grace period.
            if not self.stopping.is_set():
                self._kill_all(grace=0)
            self.done.set()

    def _spawn(self, container: Mapping[str, Any]) -> subprocess.Popen[bytes]:
        env = podenv.container_env(self.pod, container, self.lookup)
        argv = podenv.container_argv(container, env)
        cwd = container.get("workingDir")
        out = (self.sandbox / f"{container['name']}.log").open("ab")
        with out:
            return subprocess.Popen(
                argv,
                env={**os.environ, "PATH": _path(), "POLYRL_POD_SANDBOX": str(self.sandbox), **env},
                cwd=cwd if cwd and Path(cwd).is_dir() else self.sandbox,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _run_init_containers(self) -> bool:
        for container in self.pod["spec"].get("initContainers") or []:
            try:
                proc = self._spawn(container)
            except (OSError, podenv.EnvError) as err:
                self._fail_start(container["name"], err)
                return False
            with self._lock:
                self.procs[container["name"]] = proc
            code = self._wait(proc)
            if self.stopping.is_set():
                return False
            if code != 0:
                msg = f"init container {container['name']} exited {code}"
                self._report("Failed", reason="InitContainerFailed", message=msg)
                return False
        return True

    def _run_containers(self) -> None:
        specs = {c["name"]: c for c in self.pod["spec"]["containers"]}
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for state in self.states:
            if not self._start_container(specs[state.name], state):
                return
        self._report("Running")
        backoff = dict.fromkeys(specs, 1.0)
        while not self.stopping.is_set():
            if self._reap_exits(policy, specs, backoff):
                return
            self.stopping.wait(0.1)

    def _start_container(self, spec: Mapping[str, Any], state: ContainerState) -> bool:
        try:
            proc = self._spawn(spec)
        except (OSError, podenv.EnvError) as err:
            self._fail_start(spec["name"], err)
            return False
        with self._lock:
            self.procs[state.name] = proc
        state.pid, state.started_at = proc.pid, podstatus.stamp()
        state.exit_code = state.finished_at = None
        log.info("pod %s: container %s started, pid %d", self.key, state.name, proc.pid)
        return True

    def _reap_exits(self, policy: str, specs: Mapping[str, Any], backoff: dict[str, float]) -> bool:
        """Record exits; restart under Always/OnFailure. True once the pod is final."""
        for state in self.states:
            proc = self.procs.get(state.name)
            if proc is None or state.exit_code is not None or proc.poll() is None:
                continue
            state.exit_code, state.finished_at = proc.returncode, podstatus.stamp()
            log.info("pod %s: container %s exited %d", self.key, state.name, proc.returncode)
            if policy == "Always" or (policy == "OnFailure" and proc.returncode != 0):
                self._report("Running")
                if self.stopping.wait(backoff[state.name]):
                    return True
                backoff[state.name] = min(MAX_BACKOFF, backoff[state.name] * 2)
                state.restarts += 1
                if not self._start_container(specs[state.name], state):
                    return True
                self._report("Running")
            elif all(s.exit_code is not None for s in self.states):
                self._report(podstatus.final_phase(self.states))
                return True
            else:
                self._report("Running")
        return False

    def _wait(self, proc: subprocess.Popen[bytes]) -> int:
        while proc.poll() is None and not self.stopping.is_set():
            time.sleep(0.1)
        return proc.returncode if proc.returncode is not None else -1

    def _fail_start(self, name: str, err: Exception) -> None:
        for state in self.states:
            if state.name == name:
                state.exit_code, state.finished_at = 128, podstatus.stamp()
                state.reason, state.message = "StartError", str(err)
        log.warning("pod %s: container %s could not start: %s", self.key, name, err)
        self._report("Failed", reason="StartError", message=f"{name}: {err}")

    def _report(self, phase: str, *, reason: str = "", message: str = "") -> None:
        if self.stopping.is_set() and phase == "Running":
            return
        status = podstatus.pod_status(
            phase, self.states, start_time=self.start_time, reason=reason, message=message
        )
        self.patch_status(status)

    def terminate(self, grace: float) -> None:
        """Graceful deletion: stop the runner, SIGTERM, wait `grace` s, SIGKILL."""
        self.stopping.set()
        self._kill_all(grace=grace)
        self.thread.join(timeout=grace + 10)

    def _kill_all(self, *, grace: float) -> None:
        with self._lock:
            procs = list(self.procs.values())
        # Signal every group, even one whose leader exited: its children may live on.
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
