"""`cluster up` / `cluster down` by hand: PIDs recorded, then exactly those stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl.local import processes
from polyrl.testing import tools


def cluster_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polyrl.testing.cluster", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_cluster_up_records_its_processes_and_down_stops_them(
    k8s_tools: tools.Tools, tmp_path: Path
) -> None:
    workdir = tmp_path / "cluster"
    up = cluster_cli("up", "--dir", str(workdir), "--nodes", "1")
    assert up.returncode == 0, up.stderr
    assert f"export KUBECONFIG={workdir / 'admin.kubeconfig'}" in up.stdout
    assert "cluster ready in" in up.stdout
    state = json.loads((workdir / "state.json").read_text())
    names = [p["name"] for p in state["processes"]]
    assert names == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "node-agent",
    ]
    try:
        nodes = subprocess.run(
            [str(k8s_tools.kubectl), "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "KUBECONFIG": state["kubeconfig"]},
        )
        assert nodes.stdout.split() == ["node/polyrl-node-0"]
        again = cluster_cli("up", "--dir", str(workdir))
        assert again.returncode == 1
        assert "already up" in again.stderr
    finally:
        down = cluster_cli("down", "--dir", str(workdir))
    assert down.returncode == 0
    for entry in state["processes"]:
        assert not processes.is_ours(entry["pid"], entry["argv0"]), entry["name"]
    assert not workdir.exists()
