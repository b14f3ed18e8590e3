"""Tools for the sandbox tests: one that works, and one for each way a tool goes wrong."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Any


def add(a: int, b: int) -> int:
    return a + b


def divide(a: int, b: int) -> float:
    return a / b


def scratch_roundtrip(text: str) -> str:
    with open("note.txt", "w") as f:  # the working directory is the scratch directory
        f.write(text)
    with open("note.txt") as f:
        return f.read()


def hang(seconds: float) -> None:
    time.sleep(seconds)


def crash() -> None:
    os.abort()


def exits() -> None:
    raise SystemExit(3)


def hog(megabytes: int) -> int:
    return len(bytearray(megabytes * 2**20))


def garbage() -> Any:
    return object()


def flood(kilobytes: int) -> str:
    return "x" * (kilobytes * 1024)


def connect(port: int) -> None:
    socket.create_connection(("127.0.0.1", port), timeout=1)


def write_outside(path: str) -> None:
    with open(path, "w") as f:
        f.write("escaped")


def read_outside(path: str) -> str:
    with open(path) as f:
        return f.read()


def run_program() -> int:
    return subprocess.run(["true"], check=True).returncode
