"""Stopping by PID reaches children that their launcher put into sessions of their own."""

from __future__ import annotations

import sys
from pathlib import Path

from polyrl.local import processes
from polyrl.testing.waiting import wait_until

LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_stop_all_stops_a_grandchild_in_its_own_session(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    proc = processes.start("launcher", [sys.executable, "-c", LAUNCHER], log=log)
    said = wait_until("the launcher to print its child's PID", lambda: log.read_text().strip())
    grandchild = int(said.split()[0])
    assert grandchild in processes.descendants(proc.pid)
    processes.stop_all([proc], grace=2)
    assert not proc.alive()
    assert processes._start_time(grandchild) is None
