"""Small helpers for tests that drive a cluster with real kubectl and the Python client
(waiting for what they do: `polyrl.testing.waiting`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any


class Kubectl:
    """Runs the cached kubectl against one kubeconfig; failures raise with kubectl's stderr."""

    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json").stdout)

    def apply(self, manifest: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self("apply", "-f", "-", *extra, input=manifest)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == kind:
            status: str = cond["status"]
            return status
    return None
