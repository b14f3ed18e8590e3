"""Python tools run in a subprocess with a timeout, a memory cap and a guard on what they touch.

A tool is a plain function (`module:function`) that takes JSON arguments and returns something
JSON can hold. Each call runs in a fresh `python -I` process (`run_tool`), which first caps
itself (address space, CPU seconds, file size, open files), moves into a scratch directory of
its own, imports the tool and then installs an audit hook (PEP 578) that refuses, for the rest
of the process:
- sockets of any kind (no network),
- opening a file to write anywhere but the scratch directory, or to read anywhere but the
  scratch directory and the directories Python imports from (its standard library, site
  packages and the job's `sys.path`),
- starting programs or processes (`subprocess`, `os.system`, `os.exec*`, `os.fork`), and
  loading native code (`ctypes`).

What this does not isolate, stated plainly: it is a guard against accidents and a bound on
cost, not a security boundary. Code that means harm can get past an audit hook (through a
C extension already loaded, or by corrupting the interpreter), can read what the worker's
user can read under the import directories, and shares the worker's user, kernel and
network namespace. Tools that run untrusted code (a code interpreter for a model's programs)
belong in a container sandbox of their own (gVisor, Firecracker, a separate pod), called
from a tool like any other service.

At most one call per core runs at once in a process (the rest wait their turn, and their
timeout starts when they do). Each call starts an interpreter and imports the tool's module:
keep tools in light modules (the calculator example's takes 30 ms a call; importing polyrl's
workflows as well would take ten times that).

Outcomes: the tool's return value (`ToolResult.output`, JSON text); an exception the tool
raised is its answer too (`ToolResult.error`, "ZeroDivisionError: division by zero"), for
the policy to read, as a calculator shows an error. A tool that hangs past its timeout,
dies (a crash, the memory cap, `sys.exit`), touches what it may not, or returns what is not
JSON, or too much of it, raises `ToolFailed` with a reason: the workflow drops the episode
and the runner counts it (reason `tool`), and the runner itself never stops for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.workers.workflows.dropped import EpisodeDropped

DEFAULT_TIMEOUT = 5.0  # seconds
DEFAULT_MEMORY = 512 * 2**20  # bytes of address space
MAX_OUTPUT = 64 * 2**10  # bytes of JSON a tool may return

# The child: caps itself, imports the tool, guards, calls, prints one JSON line.
CHILD = r"""
import json, os, resource, sys, traceback
request = json.loads(sys.stdin.readline())
sys.path[:0] = request["path"]
memory, cpu = request["memory"], request["cpu"]
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (request["file_bytes"],) * 2)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
scratch = os.path.realpath(request["scratch"])
os.chdir(scratch)
module_name, _, attr = request["tool"].partition(":")
import importlib
try:
    tool = getattr(importlib.import_module(module_name), attr)
except (ImportError, AttributeError) as err:
    sys.stdout.write(json.dumps({"unloadable": f"{type(err).__name__}: {err}"}) + "\n")
    sys.exit(0)
readable = tuple(os.path.realpath(p) for p in sys.path if p) + (scratch,)
REFUSED = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork",
           "os.forkpty", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata")
class Refused(Exception):
    pass
def inside(path, roots):
    path = os.path.realpath(path)
    return any(path == r or path.startswith(r + os.sep) for r in roots)
def guard(event, args):
    if event.startswith("socket."):
        raise Refused(f"no network in a tool ({event})")
    if event in REFUSED:
        raise Refused(f"a tool may not start programs or load native code ({event})")
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = os.fsdecode(args[0])
        mode, flags = args[1] or "r", args[2] or 0
        writes = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR)
        roots = (scratch,) if writes else readable
        if not inside(path, roots):
            raise Refused(f"a tool may not open {path!r} {'to write' if writes else ''}".strip())
sys.addaudithook(guard)
try:
    out = {"output": tool(**request["arguments"])}
except Refused as err:
    out = {"refused": str(err)}
except MemoryError:
    out = {"memory": True}
except Exception as err:
    out = {"error": f"{type(err).__name__}: {err}"}
try:
    text = json.dumps(out)
except (TypeError, ValueError) as err:
    text = json.dumps({"garbage": f"{type(out.get('output')).__name__} is not JSON ({err})"})
sys.stdout.write(text + "\n")
sys.stdout.flush()
"""


class ToolFailed(EpisodeDropped):
    """A tool call that gave no answer: hung, died, refused, or returned garbage."""

    reason = "tool"

    def __init__(self, tool: str, why: str) -> None:
        super().__init__(f"tool {tool!r} failed: {why}")
        self.tool, self.why = tool, why


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool answered: its return value as JSON text, or the exception it raised."""

    output: str | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        """What the policy is shown."""
        return self.output if self.error is None else f"error: {self.error}"  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Limits:
    """What one call may use."""

    timeout: float = DEFAULT_TIMEOUT
    """Seconds of wall time, the interpreter's start included."""
    memory: int = DEFAULT_MEMORY
    """Bytes of address space (RLIMIT_AS)."""
    file_bytes: int = 16 * 2**20
    """Bytes any one file it writes may reach (RLIMIT_FSIZE)."""
    max_output: int = MAX_OUTPUT
    """Bytes of JSON it may return."""


async def run_tool(
    tool: str,
    arguments: dict[str, Any],
    *,
    limits: Limits = Limits(),
    path: list[str] | None = None,
) -> ToolResult:
    """Call `tool` (`module:function`) with `arguments` in a sandboxed subprocess (see the
    module docstring); `path`: where it is imported from, ahead of the child's own (default:
    this process's sys.path, so a job's workflow modules are found as the runner finds them)."""
    scratch = Path(tempfile.mkdtemp(prefix="polyrl-tool-"))
    request = {
        "tool": tool,
        "arguments": arguments,
        "path": _import_path(sys.path if path is None else path),
        "scratch": str(scratch),
        "memory": limits.memory,
        "cpu": max(1, int(limits.timeout) + 1),
        "file_bytes": limits.file_bytes,
    }
    try:
        async with _slots():  # the timeout counts from the start, not from the queue
            out = await _call(tool, request, limits)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _result(tool, out, limits)


_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _slots() -> asyncio.Semaphore:
    """The calls that may run at once on this event loop: one per core (at least two). A
    runner with 32 episodes in flight would otherwise start 32 interpreters at once, on two
    cores, and each would run out its timeout starting up."""
    loop = asyncio.get_running_loop()
    if loop not in _SLOTS:
        _SLOTS[loop] = asyncio.Semaphore(max(2, os.cpu_count() or 1))
    return _SLOTS[loop]


def _import_path(path: list[str]) -> list[str]:
    """`path` as absolute directories: the child runs in its scratch directory."""
    return [os.path.abspath(p) for p in path]


async def _call(tool: str, request: dict[str, Any], limits: Limits) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", CHILD,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=request["scratch"],
        env={"PATH": os.defpath, "HOME": request["scratch"], "LANG": "C.UTF-8"},
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(json.dumps(request).encode() + b"\n"), timeout=limits.timeout
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its session: the tool and anything it left
        await proc.wait()
        raise ToolFailed(tool, f"no answer within {limits.timeout:g} s") from None
    if proc.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise ToolFailed(tool, f"it died ({_exit(proc.returncode)}) {last[0][:200]}".strip())
    return out


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


def _result(tool: str, out: bytes, limits: Limits) -> ToolResult:
    try:
        answer = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError, UnicodeDecodeError):
        raise ToolFailed(tool, f"it printed no answer ({out[-200:]!r})") from None
    failures = (
        ("unloadable", "it cannot be imported: {}"),
        ("refused", "{}"),
        ("memory", "it ran out of its memory cap"),
        ("garbage", "{}"),
    )
    for key, why in failures:
        if key in answer:
            raise ToolFailed(tool, why.format(answer[key]))
    if "error" in answer:
        return ToolResult(error=str(answer["error"]))
    text = json.dumps(answer["output"], ensure_ascii=False)
    if len(text.encode()) > limits.max_output:
        raise ToolFailed(tool, f"it returned {len(text.encode())} bytes, over {limits.max_output}")
    return ToolResult(output=text)


__all__ = ["Limits", "ToolFailed", "ToolResult", "run_tool"]
