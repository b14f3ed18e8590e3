"""The one part of the kubelet's HTTPS API that the agent serves: container logs.

`kubectl logs` asks the API server, which connects to the pod's node at its InternalIP and
`status.daemonEndpoints.kubeletEndpoint.Port` (the test API server prefers InternalIP and,
given no kubelet CA, does not verify the serving certificate) and fetches
`/containerLogs/<namespace>/<pod>/<container>`. Supported: `follow`, `previous`,
`tailLines` and `limitBytes`; `timestamps` and `sinceSeconds` are ignored (the agent keeps
no per-line times). Nothing else of the kubelet API exists here (no exec, attach or
port-forward), and requests are not authenticated: the server listens on loopback only.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("polyrl.nodeagent")


class LogSource(Protocol):
    def log_file(self, container: str, *, previous: bool = False) -> Path: ...

    def running(self, container: str) -> bool: ...


Find = Callable[[str, str], LogSource | None]  # (namespace, pod) -> its runner


def tail(data: bytes, lines: int | None, limit: int | None) -> bytes:
    """The last `lines` lines, then at most `limit` bytes (the kubelet applies both)."""
    if lines is not None:
        parts = data.splitlines(keepends=True)
        data = b"".join(parts[-lines:]) if lines > 0 else b""
    if limit is not None:
        data = data[:limit]
    return data


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("kubelet api: " + format, *args)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if parts == ["healthz"]:
            self._text(200, b"ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._text(404, b"the polyrl node agent serves only /containerLogs\n")
            return
        _, namespace, pod, container = parts
        runner = self.server.find(namespace, pod)
        if runner is None:
            self._text(404, f"pod {namespace}/{pod} is not on this node agent\n".encode())
            return
        query = urllib.parse.parse_qs(url.query)
        self._logs(runner, container, query)

    def _logs(self, runner: LogSource, container: str, query: dict[str, list[str]]) -> None:
        def flag(name: str) -> bool:
            return query.get(name, ["false"])[0].lower() in ("true", "1")

        def number(name: str) -> int | None:
            return int(query[name][0]) if name in query else None

        path = runner.log_file(container, previous=flag("previous"))
        if not path.exists():
            which = "previous" if flag("previous") else "current"
            self._text(404, f"no {which} log for container {container!r}\n".encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        with path.open("rb") as f:
            self.wfile.write(tail(f.read(), number("tailLines"), number("limitBytes")))
            self.wfile.flush()
            if flag("follow") and not flag("previous"):
                self._follow(runner, container, f)

    def _follow(self, runner: LogSource, container: str, f: Any) -> None:
        while not self.server.stopping.is_set():
            chunk = f.read(64 * 1024)
            if chunk:
                self.wfile.write(chunk)
                self.wfile.flush()
                continue
            if not runner.running(container):
                self.wfile.write(f.read())
                return
            time.sleep(0.2)

    def _text(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    find: Find
    stopping: threading.Event


class KubeletApi:
    """Serves container logs over HTTPS on 127.0.0.1:`port` (0: a free one)."""

    def __init__(self, find: Find, *, cert: Path, key: Path, port: int = 0) -> None:
        self.server = _Server(("127.0.0.1", port), _Handler)
        self.server.find = find
        self.server.stopping = threading.Event()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        # The handshake happens on the handler's thread (first read), not in accept().
        self.server.socket = ctx.wrap_socket(
            self.server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="kubelet-api", daemon=True
        )

    @property
    def port(self) -> int:
        port: int = self.server.server_address[1]
        return port

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.stopping.set()
        self.server.shutdown()
        self.server.server_close()
