"""Peak resident memory of this process, and starting the peak over (Linux)."""

from __future__ import annotations

import resource
from pathlib import Path


def peak_gb() -> float:
    """The peak resident memory since the last `reset_peak` (Linux's VmHWM), else since the
    process started."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 2**20, 3)  # kB
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def current_gb() -> float:
    """This process's resident memory now (Linux's VmRSS); 0.0 where it cannot be read."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 2**20, 3)  # kB
    return 0.0


def reset_peak() -> None:
    """Start the peak over from what is resident now (`clear_refs` 5), so that a step's peak
    is not the model load's."""
    Path("/proc/self/clear_refs").write_text("5")
