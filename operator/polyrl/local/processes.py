"""Start and stop local processes (`polyrl run`'s workers, a test control plane), by PID only.

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

from polyrl.local.errors import StartupError


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


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, found through /proc's parent links.

    Some launchers (torchrun) start their children in sessions of their own, out of reach
    of a process-group signal; stopping by PID must still reach them.
    """
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a zombie;
    with the PID it names one process, so a recycled PID is never signalled."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _signal_if_same(pid: int, start: str | None, sig: signal.Signals) -> None:
    if start is not None and _start_time(pid) == start:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_all(procs: list[Managed], *, grace: float = 10.0) -> None:
    """Like `stop`, for many at once: all get SIGTERM together and share one grace period;
    their descendants too, wherever their launcher put them."""
    alive = [p for p in procs if p.alive()]
    family = [(d, _start_time(d)) for p in alive for d in descendants(p.pid)]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    for pid, start in family:
        _signal_if_same(pid, start, signal.SIGTERM)
    deadline = time.monotonic() + grace

    def family_alive() -> bool:
        return any(start is not None and _start_time(pid) == start for pid, start in family)

    while time.monotonic() < deadline and (any(p.alive() for p in alive) or family_alive()):
        time.sleep(0.05)
    for proc in procs:
        stop(proc, grace=0)
    for pid, start in family:
        _signal_if_same(pid, start, signal.SIGKILL)


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
        # As servers bind (Go's net.Listen sets it): connections of a server that just
        # stopped, left in TIME_WAIT, do not make the port taken; a listener still does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise StartupError(step, f"port 127.0.0.1:{port} is already in use ({err})") from None


def tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
