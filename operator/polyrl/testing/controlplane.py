"""A real Kubernetes control plane on 127.0.0.1: etcd, API server, controller manager, scheduler.

No kubelet and no container runtime run here; `nodeagent` registers nodes and plays the
kubelet's part. Everything listens on loopback only, on free ports unless told otherwise,
with fresh certificates, RBAC (and the Node authorizer) on, and etcd without fsync (a test
cluster trades durability for speed). `stop()` stops every process by PID and removes the
data; a failed `start()` does the same before it raises, so nothing stray is left behind.
"""

from __future__ import annotations

import json
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from polyrl.local import processes
from polyrl.local.errors import StartupError
from polyrl.testing import pki
from polyrl.testing.tools import Tools

SERVICE_CIDR = "10.0.0.0/24"


@dataclass(slots=True)
class Timings:
    """Seconds spent in each start-up step, printed by `cluster up` and the test session."""

    steps: dict[str, float] = field(default_factory=dict)

    def total(self) -> float:
        return sum(self.steps.values())

    def summary(self) -> str:
        """ "ready in 9.1s: certificates 0.1s, etcd 0.9s, ..." (every start-up step)."""
        parts = ", ".join(f"{k} {v:.1f}s" for k, v in self.steps.items())
        return f"ready in {self.total():.1f}s: {parts}"


class ControlPlane:
    """Start with `start()`, use `kubeconfig`, end with `stop()` (also a context manager)."""

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        tools: Tools,
        apiserver_port: int = 0,
        etcd_port: int = 0,
        ready_timeout: float = 90.0,
    ) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="polyrl-k8s-"))
        self.tools = tools
        self.apiserver_port = apiserver_port
        self.etcd_port = etcd_port
        self.ready_timeout = ready_timeout
        self.procs: list[processes.Managed] = []  # running now
        self.started: list[processes.Managed] = []  # ever started, for tests and post-mortems
        self.timings = Timings()
        self._pki: pki.Pki | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._step("certificates", self._make_pki)
            self._step("etcd", self._start_etcd)
            self._step("kube-apiserver", self._start_apiserver)
            self._step("kube-controller-manager", self._start_controller_manager)
            self._step("kube-scheduler", self._start_scheduler)
        except BaseException:
            self.stop(remove=False)
            raise

    def stop(self, *, remove: bool = True) -> None:
        """Stop in reverse order (etcd last), then remove the data unless told to keep it."""
        for proc in reversed(self.procs):
            processes.stop(proc)
        self.procs.clear()
        if remove:
            _rmtree(self.workdir / "etcd")
            _rmtree(self.workdir / "pki")

    def state(self) -> dict[str, Any]:
        """What `cluster down` needs to stop this control plane from another process."""
        return {
            "workdir": str(self.workdir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "processes": [
                {"name": p.name, "pid": p.pid, "argv0": p.argv0, "log": str(p.log)}
                for p in self.procs
            ],
        }

    def _step(self, name: str, fn: Any) -> None:
        started = time.monotonic()
        fn()
        self.timings.steps[name] = time.monotonic() - started

    def _make_pki(self) -> None:
        self._pki = pki.generate(self.workdir / "pki")

    @property
    def pki(self) -> pki.Pki:
        assert self._pki is not None, "start() makes the certificates first"
        return self._pki

    def _launch(self, name: str, argv: list[str | Path]) -> processes.Managed:
        if not Path(argv[0]).is_file():
            raise StartupError(f"{name}: find binary", f"{argv[0]} does not exist")
        proc = processes.start(name, argv, log=self.logs / f"{name}.log", cwd=self.workdir)
        self.procs.append(proc)
        self.started.append(proc)
        return proc

    def _start_etcd(self) -> None:
        self.etcd_port = self._port("etcd", self.etcd_port)
        peer = processes.free_port()
        data = self.workdir / "etcd"
        data.mkdir(parents=True, exist_ok=True)
        proc = self._launch(
            "etcd",
            [
                self.tools.etcd,
                "--name=default",
                f"--data-dir={data}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        url = f"http://127.0.0.1:{self.etcd_port}/health"
        self._wait(proc, "etcd: wait for health", lambda: _get_json(url).get("health") == "true")

    def _start_apiserver(self) -> None:
        self.apiserver_port = self._port("kube-apiserver", self.apiserver_port)
        p = self.pki
        proc = self._launch(
            "kube-apiserver",
            [
                self.tools.kube_apiserver,
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                f"--tls-cert-file={p.apiserver.cert}",
                f"--tls-private-key-file={p.apiserver.key}",
                f"--client-ca-file={p.ca.cert}",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                # Reach the node agent's kubelet API (`kubectl logs`) at 127.0.0.1: the
                # nodes' hostnames resolve nowhere.
                "--kubelet-preferred-address-types=InternalIP",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={self.workdir / 'pki' / 'generated'}",
            ],
        )
        self._write_kubeconfigs()
        self._wait(proc, "kube-apiserver: wait for /readyz", self._apiserver_ready)

    def _start_controller_manager(self) -> None:
        p, port = self.pki, processes.free_port()
        proc = self._launch(
            "kube-controller-manager",
            [
                self.tools.kube_controller_manager,
                f"--kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={p.sa_key}",
                f"--root-ca-file={p.ca.cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--horizontal-pod-autoscaler-sync-period=2s",
                f"--cert-dir={self.workdir / 'pki' / 'generated-cm'}",
            ],
        )
        url = f"https://127.0.0.1:{port}/healthz"
        self._wait(proc, "kube-controller-manager: wait for /healthz", lambda: _healthz(url))

    def _start_scheduler(self) -> None:
        port = processes.free_port()
        kubeconfig = self.workdir / "scheduler.kubeconfig"
        proc = self._launch(
            "kube-scheduler",
            [
                self.tools.kube_scheduler,
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                f"--cert-dir={self.workdir / 'pki' / 'generated-sched'}",
            ],
        )
        url = f"https://127.0.0.1:{port}/healthz"
        self._wait(proc, "kube-scheduler: wait for /healthz", lambda: _healthz(url))

    def _port(self, name: str, port: int) -> int:
        if port == 0:
            return processes.free_port()
        processes.require_free(f"{name}: bind", port)
        return port

    def _wait(self, proc: processes.Managed, step: str, ready: Any) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                reason = f"{proc.name} exited during start-up:\n{processes.tail(proc.log)}"
                raise StartupError(step, reason, proc.log)
            try:
                if ready():
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise StartupError(step, f"not ready after {self.ready_timeout:.0f}s", proc.log)

    def _apiserver_ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        ctx.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        with urllib.request.urlopen(f"{self.server}/readyz", context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)

    def _write_kubeconfigs(self) -> None:
        p = self.pki
        for name, kp in (
            ("admin", p.admin),
            ("controller-manager", p.controller_manager),
            ("scheduler", p.scheduler),
        ):
            doc = kubeconfig(self.server, ca=p.ca.cert, cert=kp.cert, key=kp.key, user=name)
            (self.workdir / f"{name}.kubeconfig").write_text(yaml.safe_dump(doc))


def kubeconfig(server: str, *, ca: Path, cert: Path, key: Path, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "polyrl-test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [
            {
                "name": "polyrl-test",
                "context": {"cluster": "polyrl-test", "user": user, "namespace": "default"},
            }
        ],
        "current-context": "polyrl-test",
    }


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=2) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def _healthz(url: str) -> bool:
    """Components serve /healthz with a self-signed certificate; only the status matters."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError:
        return False


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
