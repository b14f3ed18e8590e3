"""Start and stop the processes of a test service, by PID and never by name.

Each process gets its own session (process group), so stopping it also stops anything it
spawned, and its output goes to a log file whose path is kept for error messages. A
process is "ours" only while /proc/<pid>/cmdline still shows the binary we started, which
guards `cluster down` against a PID the kernel has since handed to someone else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from polyrl.testing.errors import StartupError


@dataclass(slots=True)
class Managed:
    """A process we started: its name, PID, command line and log file."""

    name: str
    pid: int
    argv0: str
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return is_ours(self.pid, self.argv0)


def start(
    name: str,
    argv: Sequence[str | Path],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Managed:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(
            [str(a) for a in argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    return Managed(name=name, pid=popen.pid, argv0=str(argv[0]), log=log, popen=popen)


def is_ours(pid: int, argv0: str) -> bool:
    """True while `pid` is alive and still runs `argv0` (not a recycled PID)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace") == argv0


def stop(proc: Managed, *, grace: float = 10.0) -> None:
    """SIGTERM the process group, wait up to `grace` seconds, then SIGKILL it."""
    if not proc.alive():
        _reap(proc)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and proc.alive():
        time.sleep(0.05)
    if proc.alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    _reap(proc)


def stop_all(procs: list[Managed], *, grace: float = 10.0) -> None:
    """Like `stop`, for many at once: all get SIGTERM together and share one grace period."""
    alive = [p for p in procs if p.alive()]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.alive() for p in alive):
        time.sleep(0.05)
    for proc in procs:
        stop(proc, grace=0)


def _reap(proc: Managed) -> None:
    if proc.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=5)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def require_free(step: str, port: int) -> None:
    """Fail early and clearly when a port we were told to use is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise StartupError(step, f"port 127.0.0.1:{port} is already in use ({err})") from None


def tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
