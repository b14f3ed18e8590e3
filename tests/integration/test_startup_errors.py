"""Bad start-up conditions stop with a message naming the step and the log, leaving no process."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from polyrl.local.errors import StartupError
from polyrl.local.natsserver import NatsServer
from polyrl.testing import tools
from polyrl.testing.controlplane import ControlPlane


@pytest.fixture
def occupied_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def nothing_left_running(plane: ControlPlane) -> bool:
    return not plane.procs and not any(p.alive() for p in plane.started)


def test_building_without_go_names_the_missing_toolchain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(StartupError) as err:
        tools.build(("etcd",), quiet=True)
    assert err.value.step == "find Go toolchain"
    assert "'go' is not on PATH" in str(err.value)


def test_a_failed_build_names_its_step_and_log_and_leaves_no_half_built_cache(
    tmp_path: Path,
) -> None:
    script = resources.files("polyrl.testing").joinpath("build-tools.sh")
    tools_dir, logs = tmp_path / "tools", tmp_path / "logs"
    env = {
        **os.environ,
        "POLYRL_K8S_VERSION": "v1.36.3",
        "POLYRL_HELM_VERSION": "v3.19.5",
        "POLYRL_KUEUE_VERSION": "v0.17.0",
        "POLYRL_ETCD_VERSION": "v3.0.999-does-not-exist",
        "POLYRL_TOOLS_DIR": str(tools_dir),
        "POLYRL_LOGS_DIR": str(logs),
    }
    proc = subprocess.run(
        ["bash", str(script), "etcd"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode != 0
    log = logs / "build-etcd-v3.0.999-does-not-exist.log"
    assert "FAILED at step 'etcd: resolve modules (go mod tidy)'" in proc.stderr
    assert str(log) in proc.stderr
    assert log.is_file()
    assert list(tools_dir.iterdir()) == []  # neither a stamped dir nor a temporary one


def test_a_half_built_tool_directory_is_not_taken_for_a_good_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYRL_CACHE", str(tmp_path))
    partial = tools.component_dir("etcd")
    partial.mkdir(parents=True)
    (partial / "etcd").write_text("truncated")
    assert not tools.is_built("etcd")
    (partial / ".complete").touch()
    assert tools.is_built("etcd")


def test_an_apiserver_port_in_use_stops_the_start_and_leaves_no_process(
    k8s_tools: tools.Tools, tmp_path: Path, occupied_port: int
) -> None:
    plane = ControlPlane(tmp_path, tools=k8s_tools, apiserver_port=occupied_port)
    with pytest.raises(StartupError) as err:
        plane.start()
    assert err.value.step == "kube-apiserver: bind"
    assert f"127.0.0.1:{occupied_port} is already in use" in str(err.value)
    assert [p.name for p in plane.started] == ["etcd"]
    assert nothing_left_running(plane)  # etcd, started first, was stopped again


def test_an_etcd_that_will_not_start_is_reported_with_its_log(
    k8s_tools: tools.Tools, tmp_path: Path
) -> None:
    broken = tmp_path / "etcd"
    broken.write_text("#!/bin/sh\necho 'etcd: cannot open data dir' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    plane = ControlPlane(tmp_path / "plane", tools=replace(k8s_tools, etcd=broken))
    with pytest.raises(StartupError) as err:
        plane.start()
    assert err.value.step == "etcd: wait for health"
    assert err.value.log == tmp_path / "plane" / "logs" / "etcd.log"
    assert "cannot open data dir" in str(err.value)
    assert nothing_left_running(plane)


def test_a_nats_port_in_use_is_reported_clearly(tmp_path: Path, occupied_port: int) -> None:
    server = NatsServer(tmp_path, port=occupied_port)
    with pytest.raises(StartupError) as err:
        server.start()
    assert err.value.step == "nats-server: bind"
    assert server.proc is None
