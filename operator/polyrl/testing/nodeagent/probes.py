"""Startup, readiness and liveness probes, with the kubelet's timing and thresholds.

A `Prober` holds one probe of one container: when it is due (`initialDelaySeconds`, then
every `periodSeconds`), and its verdict after `successThreshold` successes or
`failureThreshold` failures in a row. How a probe is run (`httpGet` and `tcpSocket`
against the pod's address, `exec` through the container launcher) is given to it as a
function, so the bookkeeping is tested on its own. gRPC probes are not supported.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

KINDS = ("startupProbe", "readinessProbe", "livenessProbe")


class ProbeError(ValueError):
    """A probe the node agent cannot run (gRPC, an unknown port name)."""


@dataclass(slots=True)
class Prober:
    kind: str  # startupProbe | readinessProbe | livenessProbe
    spec: Mapping[str, Any]
    check: Callable[[float], bool]  # runs the probe once within a timeout
    started: float = field(default_factory=time.monotonic)
    ok: bool | None = None  # the verdict so far; None before the first threshold is reached
    successes: int = 0
    failures: int = 0
    last: float | None = None
    runs: int = 0

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    def due(self, now: float) -> bool:
        if now - self.started < float(self.spec.get("initialDelaySeconds", 0)):
            return False
        return self.last is None or now - self.last >= self.period

    def record(self, success: bool, now: float) -> bool | None:
        """Count one result; returns the verdict (True, False, or None: undecided)."""
        self.last, self.runs = now, self.runs + 1
        if success:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.ok = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.ok = False
        return self.ok

    def probe(self, now: float) -> bool | None:
        timeout = float(self.spec.get("timeoutSeconds", 1))
        try:
            success = self.check(timeout)
        except Exception:  # a probe that cannot even run has failed
            success = False
        return self.record(success, now)


def port_number(port: int | str, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ProbeError(f"probe port {port!r} is not a port of container {container['name']!r}")


def http_check(
    spec: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str
) -> Callable[[float], bool]:
    host = spec.get("host") or pod_ip
    port = port_number(spec["port"], container)
    path = spec.get("path", "/")
    headers = {h["name"]: h["value"] for h in spec.get("httpHeaders") or []}
    https = spec.get("scheme", "HTTP").upper() == "HTTPS"

    def check(timeout: float) -> bool:
        if https:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=ctx
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("GET", path, headers={"User-Agent": "kube-probe/1.36", **headers})
            return 200 <= conn.getresponse().status < 400
        finally:
            conn.close()

    return check


def tcp_check(
    spec: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str
) -> Callable[[float], bool]:
    host = spec.get("host") or pod_ip
    port = port_number(spec["port"], container)

    def check(timeout: float) -> bool:
        with socket.create_connection((host, port), timeout=timeout):
            return True

    return check


def probers(
    container: Mapping[str, Any],
    pod_ip: str,
    run_exec: Callable[[list[str], float], bool],
) -> dict[str, Prober]:
    """The container's probes, by kind; raises ProbeError for one it cannot run."""
    found = {}
    for kind in KINDS:
        spec = container.get(kind)
        if not spec:
            continue
        if "httpGet" in spec:
            check = http_check(spec["httpGet"], container, pod_ip)
        elif "tcpSocket" in spec:
            check = tcp_check(spec["tcpSocket"], container, pod_ip)
        elif "exec" in spec:
            command = list(spec["exec"]["command"])

            def check(timeout: float, command: list[str] = command) -> bool:
                return run_exec(command, timeout)

        else:
            raise ProbeError(
                f"container {container['name']!r}: {kind} {sorted(set(spec) & {'grpc'})} "
                "is not supported by the node agent"
            )
        found[kind] = Prober(kind, spec, check)
    return found
