"""Running one pod's containers as local processes (exec mode), one thread per pod.

The thread owns the pod's processes from start to final status. It first sets up the pod's
volumes (waiting, as a kubelet does, for a ConfigMap that does not exist yet or a claim not
yet bound), then runs the init containers in order to completion, then starts every
container, each through the container launcher (`container.py`: its own mount and UTS
namespaces, the pod's volumes, hostname and /etc/hosts, the termination-message file) with
the pod's address (`podnet`) and the in-cluster API env. Each exit is reported at once:
under `restartPolicy: Never` the pod ends Succeeded when every container exited 0, else
Failed; under `Always`/`OnFailure` an exited container is restarted with a doubling backoff
(1 s up to 30 s), like CrashLoopBackOff, its previous log kept for `kubectl logs --previous`.
A termination message comes from the container's `terminationMessagePath`, or from the end
of its log under `FallbackToLogsOnError`. Probes run on a second thread (`probes`):
readiness decides the container's and the pod's Ready condition, a failed liveness or
startup probe kills the container (which is then restarted, or fails the pod). Volumes with
contents from the API (ConfigMaps, Secrets, tokens) are re-synced every `volume_sync`
seconds. `terminate()` is graceful deletion: SIGTERM to each process group, SIGKILL after
the grace period.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polyrl.local import podenv
from polyrl.testing.nodeagent import container as launcher
from polyrl.testing.nodeagent import podnet, podstatus, probes, volumes
from polyrl.testing.nodeagent.podstatus import ContainerState

log = logging.getLogger("polyrl.nodeagent")

PatchStatus = Callable[[dict[str, Any]], None]
MAX_BACKOFF = 30.0
MESSAGE_BYTES = 4096  # the kubelet's limit on a termination message
FALLBACK_BYTES, FALLBACK_LINES = 2048, 80  # FallbackToLogsOnError: the end of the log
LAUNCHER = Path(launcher.__file__)


def _path() -> str:
    """The agent's PATH with its own interpreter's directory first, so a pod's `polyrl`,
    `torchrun` or `python` is the virtualenv's, however the agent itself was started."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What the node gives every pod: API reads, the API server's address, the bind shim,
    the host paths that stay visible in every pod, and the kubelet's timings."""

    source: volumes.Source
    lookup: podenv.Lookup
    api_host: str
    api_port: int
    shim: Path | None = None
    keep: tuple[str, ...] = ()
    token_max_age: float = 24 * 3600.0
    volume_sync: float = 10.0
    pass_env: Mapping[str, str] = field(default_factory=dict)
    images: Mapping[str, str] = field(default_factory=dict)
    """Image name (no tag) -> a Python environment whose `bin` leads a container's PATH: the
    agent's stand-in for pulling that image (`image_path`)."""


def image_path(image: str, images: Mapping[str, str], path: str) -> str:
    """`path` with the bin directory of `image`'s environment first, if the agent has one for
    it (matched by name, any tag or digest); else `path` as it is."""
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    env = images.get(name)
    return path if env is None else os.pathsep.join([str(Path(env) / "bin"), path])


def hosts_file(
    pod: Mapping[str, Any], ip: str, hostname: str, peers: Sequence[tuple[str, str]] = ()
) -> str:
    """The kubelet-managed /etc/hosts: localhost, the pod's own name, its hostAliases; and,
    standing in for cluster DNS, which the test cluster has not, the records a headless
    Service would give the pod's `subdomain`: each running peer's (ip, hostname), by its
    full name and by `<hostname>.<subdomain>` (what the search path makes of it)."""
    spec, ns = pod["spec"], pod["metadata"]["namespace"]
    names = [hostname]
    if sub := spec.get("subdomain"):  # with `<hostname>.<subdomain>`, as DNS resolves it too
        names = [f"{hostname}.{sub}.{ns}.svc.cluster.local", hostname, f"{hostname}.{sub}"]
    lines = [
        "# Kubernetes-managed hosts file (polyrl node agent).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{ip}\t{' '.join(names)}",
    ]
    for alias in spec.get("hostAliases") or []:
        lines.append(f"{alias['ip']}\t{' '.join(alias.get('hostnames') or [])}")
    if sub := spec.get("subdomain"):
        for peer_ip, peer in sorted(peers):
            lines.append(f"{peer_ip}\t{peer}.{sub}.{ns}.svc.cluster.local {peer}.{sub}")
    return "\n".join(lines) + "\n"


def termination_message(
    container: Mapping[str, Any], message_file: Path, log_file: Path, exit_code: int
) -> str:
    """What the kubelet puts in `state.terminated.message`."""
    with contextlib.suppress(OSError):
        text = message_file.read_bytes()[:MESSAGE_BYTES].decode(errors="replace")
        if text:
            return text
    policy = container.get("terminationMessagePolicy", "File")
    if policy != "FallbackToLogsOnError" or exit_code == 0:
        return ""
    try:
        lines = log_file.read_bytes().splitlines(keepends=True)[-FALLBACK_LINES:]
    except OSError:
        return ""
    return b"".join(lines)[-FALLBACK_BYTES:].decode(errors="replace")


class PodRunner:
    def __init__(
        self,
        pod: Mapping[str, Any],
        *,
        sandbox: Path,
        node: NodeContext,
        pod_ip: str,
        patch_status: PatchStatus,
    ) -> None:
        self.pod = pod
        self.sandbox = sandbox
        self.node = node
        self.pod_ip = pod_ip
        self.patch_status = patch_status
        self.host_network = bool(pod["spec"].get("hostNetwork"))
        self.hostname = (pod["spec"].get("hostname") or pod["metadata"]["name"])[:63]
        self.states = podstatus.containers_of(pod)
        self.specs = {c["name"]: c for c in pod["spec"]["containers"]}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.probers: dict[str, dict[str, probes.Prober]] = {}
        self.volumes = volumes.PodVolumes(
            pod, sandbox, node.source, token_max_age=node.token_max_age
        )
        self.start_time = podstatus.stamp()
        self.stopping = threading.Event()
        self.done = threading.Event()
        self._lock = threading.Lock()
        self.peers: list[tuple[str, str]] = []  # (ip, hostname) of its subdomain's pods
        self._hosts_lock = threading.Lock()
        self.hosts_written = False
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.key}", daemon=True)

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def start(self) -> None:
        self.thread.start()

    @property
    def subdomain(self) -> tuple[str, str] | None:
        """(namespace, subdomain): the pods whose names this pod's hosts file carries."""
        sub = self.pod["spec"].get("subdomain")
        return (self.pod["metadata"]["namespace"], sub) if sub else None

    def write_hosts(self, peers: Sequence[tuple[str, str]] | None = None) -> None:
        """(Re)write /etc/hosts; `peers` (ip, hostname) replaces the peers it names. The file
        is rewritten in place: the pod's bind mount keeps seeing it."""
        with self._hosts_lock:
            if peers is not None:
                self.peers = list(peers)
            if self.sandbox.is_dir():
                text = hosts_file(self.pod, self.pod_ip, self.hostname, self.peers)
                with open(self.sandbox / "hosts", "r+" if self.hosts_written else "w") as f:
                    f.write(text)
                    f.truncate()
                self.hosts_written = True

    # --- logs, for the kubelet API ---------------------------------------------------

    def log_file(self, container: str, *, previous: bool = False) -> Path:
        return self.sandbox / (f"{container}.previous.log" if previous else f"{container}.log")

    def running(self, container: str) -> bool:
        return any(s.name == container and s.exit_code is None for s in self.states)

    # --- the pod's life ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.sandbox.mkdir(parents=True, exist_ok=True)
            if not self._set_up_volumes():
                return
            self.write_hosts()
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

    def _set_up_volumes(self) -> bool:
        """Like the kubelet's volume manager: retry what is not there yet; fail on what
        the agent cannot do."""
        reported = ""
        while not self.stopping.is_set():
            try:
                self.volumes.set_up()
                return True
            except volumes.NotReady as err:
                if str(err) != reported:
                    reported = str(err)
                    log.info("pod %s: waiting for volumes: %s", self.key, err)
                    for state in self.states:
                        state.started_at, state.reason = None, "ContainerCreating"
                        state.message = f"MountVolume.SetUp failed: {err}"
                    self._report("Pending")
                self.stopping.wait(1.0)
            except (volumes.Unsupported, podenv.EnvError, OSError) as err:
                self._report("Failed", reason="VolumeError", message=str(err))
                return False
        return False

    def _base_env(self) -> dict[str, str]:
        """What every container sees beneath its own env: a kubelet's in-cluster variables,
        the host's PATH (so the virtualenv's `polyrl` and `python` are found), the pod's
        address for the bind shim, and the sandbox (how tests find a pod's processes)."""
        host, port = self.node.api_host, str(self.node.api_port)
        env = {
            "PATH": _path(),
            "HOME": "/root",
            "HOSTNAME": self.hostname,
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
            "POLYRL_POD_SANDBOX": str(self.sandbox),
            **self.node.pass_env,
        }
        if not self.host_network:
            env.update(podnet.pod_env(self.pod_ip, self.node.shim))
        return env

    def _container_env(self, pod: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, str]:
        env = {**self._base_env(), **podenv.container_env(pod, spec, self.node.lookup)}
        env["PATH"] = image_path(str(spec.get("image", "")), self.node.images, env["PATH"])
        return env

    def _plan(
        self, spec: Mapping[str, Any], argv: list[str], env: dict[str, str], *, probe: bool
    ) -> dict[str, Any]:
        mounts = volumes.container_mounts(spec, self.volumes.path_of)
        if not probe:  # each instance starts with an empty termination-message file
            message = self.sandbox / f"{spec['name']}.termination-log"
            message.write_bytes(b"")
            target = spec.get("terminationMessagePath", "/dev/termination-log")
            mounts.append({"source": str(message), "target": target, "file": True})
        if not self.host_network:
            hosts = {"source": str(self.sandbox / "hosts"), "target": "/etc/hosts", "file": True}
            mounts.append(hosts)
        security = spec.get("securityContext") or {}
        return {
            "argv": argv,
            "env": env,
            # Each launch mounts its own tmpfs here, in its own mount namespace.
            "root": str(self.sandbox / "rootfs"),
            "cwd": spec.get("workingDir") or "/",
            "hostname": None if self.host_network else self.hostname,
            "mounts": mounts,
            "keep": list(self.node.keep),
            "read_only_root": bool(security.get("readOnlyRootFilesystem", False)),
        }

    def _launch(
        self,
        spec: Mapping[str, Any],
        argv: list[str],
        env: dict[str, str],
        out: Any,
        *,
        probe: bool = False,
    ) -> subprocess.Popen[bytes]:
        plan = self._plan(spec, argv, env, probe=probe)
        Path(plan["root"]).mkdir(parents=True, exist_ok=True)
        plan_file = self.sandbox / "plans" / f"{spec['name']}{'.probe' if probe else ''}.json"
        plan_file.parent.mkdir(exist_ok=True)
        plan_file.write_text(json.dumps(plan))
        return subprocess.Popen(
            [sys.executable, "-I", str(LAUNCHER), str(plan_file)],
            env={},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _spawn(self, spec: Mapping[str, Any]) -> subprocess.Popen[bytes]:
        pod = {**self.pod, "status": {**self.pod.get("status", {}), "podIP": self.pod_ip}}
        env = self._container_env(pod, spec)
        argv = podenv.container_argv(spec, env)
        current = self.log_file(spec["name"])
        if current.exists() and current.stat().st_size:
            current.replace(self.log_file(spec["name"], previous=True))
        with current.open("ab") as out:
            return self._launch(spec, argv, env, out)

    def run_exec(self, container: str, command: list[str], timeout: float) -> bool:
        """An exec probe: `command` in the container's view, succeeding on exit 0."""
        spec = self.specs[container]
        pod = {**self.pod, "status": {**self.pod.get("status", {}), "podIP": self.pod_ip}}
        env = self._container_env(pod, spec)
        proc = self._launch(spec, command, env, subprocess.DEVNULL, probe=True)
        try:
            return proc.wait(timeout=timeout) == 0
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False

    def _run_init_containers(self) -> bool:
        for spec in self.pod["spec"].get("initContainers") or []:
            try:
                proc = self._spawn(spec)
            except (OSError, podenv.EnvError, volumes.Unsupported) as err:
                self._fail_start(spec["name"], err)
                return False
            with self._lock:
                self.procs[spec["name"]] = proc
            code = exit_status(self._wait(proc))
            if self.stopping.is_set():
                return False
            if code != 0:
                msg = f"init container {spec['name']} exited {code}"
                self._report("Failed", reason="InitContainerFailed", message=msg)
                return False
        return True

    def _run_containers(self) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for state in self.states:
            if not self._start_container(self.specs[state.name], state):
                return
        self._report("Running")
        threading.Thread(target=self._probe_loop, name=f"probe-{self.key}", daemon=True).start()
        backoff = dict.fromkeys(self.specs, 1.0)
        next_sync = time.monotonic() + self.node.volume_sync
        while not self.stopping.is_set():
            if self._reap_exits(policy, backoff):
                return
            if time.monotonic() >= next_sync:
                next_sync = time.monotonic() + self.node.volume_sync
                if changed := self.volumes.refresh():
                    log.info("pod %s: volumes re-synced: %s", self.key, ", ".join(changed))
            self.stopping.wait(0.1)

    def _start_container(self, spec: Mapping[str, Any], state: ContainerState) -> bool:
        try:
            found = probes.probers(
                spec, self.pod_ip, lambda cmd, t: self.run_exec(spec["name"], cmd, t)
            )
            proc = self._spawn(spec)
        except (OSError, podenv.EnvError, volumes.Unsupported, probes.ProbeError) as err:
            self._fail_start(spec["name"], err)
            return False
        with self._lock:
            self.procs[state.name] = proc
            self.probers[state.name] = found
            state.pid, state.started_at = proc.pid, podstatus.stamp()
            state.exit_code = state.finished_at = None
            state.reason = state.message = ""
            state.ready = "readinessProbe" not in found
            state.started = "startupProbe" not in found
        log.info("pod %s: container %s started, pid %d", self.key, state.name, proc.pid)
        return True

    def _reap_exits(self, policy: str, backoff: dict[str, float]) -> bool:
        """Record exits; restart under Always/OnFailure. True once the pod is final."""
        for state in self.states:
            proc = self.procs.get(state.name)
            if proc is None or state.exit_code is not None or proc.poll() is None:
                continue
            code = exit_status(proc.returncode)
            self._record_exit(state, code)
            if policy == "Always" or (policy == "OnFailure" and code != 0):
                with self._lock:
                    state.back_off(backoff[state.name])
                self._report("Running")
                if self.stopping.wait(backoff[state.name]):
                    return True
                backoff[state.name] = min(MAX_BACKOFF, backoff[state.name] * 2)
                state.restarts += 1
                if not self._start_container(self.specs[state.name], state):
                    return True
                self._report("Running")
            elif all(s.exit_code is not None for s in self.states):
                self._report(podstatus.final_phase(self.states))
                return True
            else:
                self._report("Running")
        return False

    def _record_exit(self, state: ContainerState, code: int) -> None:
        spec = self.specs[state.name]
        message = termination_message(
            spec,
            self.sandbox / f"{state.name}.termination-log",
            self.log_file(state.name),
            code,
        )
        with self._lock:
            state.exit_code, state.finished_at = code, podstatus.stamp()
            if code == launcher.SETUP_FAILED and not message:
                message = "the node agent could not set up the container (see its log)"
            state.message = message or state.message
        log.info("pod %s: container %s exited %d", self.key, state.name, code)

    def _probe_loop(self) -> None:
        while not self.stopping.wait(0.2):
            if self.done.is_set():
                return
            for state in self.states:
                with self._lock:
                    found = self.probers.get(state.name, {})
                    live = state.exit_code is None and state.pid is not None
                if live:
                    self._probe(state, found)

    def _probe(self, state: ContainerState, found: dict[str, probes.Prober]) -> None:
        now = time.monotonic()
        startup = found.get("startupProbe")
        if startup is not None and not state.started:
            if startup.due(now) and (verdict := startup.probe(now)) is not None:
                if verdict:
                    state.started = True
                    self._report("Running")
                else:
                    self._kill_container(state, "failed its startup probe")
            return
        ready = found.get("readinessProbe")
        if ready is not None and ready.due(now):
            verdict = ready.probe(now)
            if verdict is not None and verdict != state.ready:
                state.ready = verdict
                log.info("pod %s: container %s ready=%s", self.key, state.name, verdict)
                self._report("Running")
        alive = found.get("livenessProbe")
        if alive is not None and alive.due(now) and alive.probe(now) is False:
            self._kill_container(state, "failed its liveness probe")

    def _kill_container(self, state: ContainerState, why: str) -> None:
        log.info("pod %s: container %s %s; killing it", self.key, state.name, why)
        with self._lock:
            proc = self.procs.get(state.name)
            state.message = f"container {why}"
            self.probers[state.name] = {}
        if proc is not None:
            grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            _stop_group(proc, grace)

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
        with self._lock:
            status = podstatus.pod_status(
                phase,
                self.states,
                start_time=self.start_time,
                pod_ip=self.pod_ip,
                reason=reason,
                message=message,
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

    def remove(self) -> None:
        """Delete what the pod left on the host (its sandbox, memory-backed volumes), but
        keep its containers' logs, as a kubelet keeps them for a while: a test reads what a
        pod said last however soon after its exit the pod was deleted."""
        self._keep_logs()
        self.volumes.remove()
        shutil.rmtree(self.sandbox, ignore_errors=True)

    def _keep_logs(self) -> None:
        kept = deleted_pod_logs(self.sandbox.parent.parent) / self.sandbox.name
        with contextlib.suppress(OSError):  # a sandbox never made, or a full disk
            logs = list(self.sandbox.glob("*.log"))
            if logs:
                kept.mkdir(parents=True, exist_ok=True)
            for log in logs:
                shutil.copyfile(log, kept / log.name)


def deleted_pod_logs(workdir: Path) -> Path:
    """Where the agent in `workdir` keeps the container logs of deleted pods, a folder per
    pod named as its sandbox was (`<namespace>_<pod>_<uid>`)."""
    return workdir / "deleted-pod-logs"


def exit_status(returncode: int) -> int:
    """A container's exit code as the kubelet reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
