"""Pure parts of the node agent's kubelet duties: mount planning, pod addresses, probes'
bookkeeping, the atomic volume writer, token refresh, termination messages, log tails."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import Any

import pytest

from polyrl.local import podenv
from polyrl.testing.nodeagent import container, kubeletapi, podnet, probes, runner, volumes
from polyrl.testing.nodeagent.container import Mount

# --- the container launcher's plan ----------------------------------------------------


def test_only_directories_above_a_missing_mount_point_are_rebuilt() -> None:
    present = {"/", "/run", "/etc", "/etc/hosts", "/tmp", "/dev"}
    dirs = {"/", "/run", "/etc", "/tmp", "/dev"}
    found = container.mirrored_dirs(
        [
            "/run/secrets/kubernetes.io/serviceaccount",  # /run exists, /run/secrets not
            "/etc/hosts",  # exists: bound over in place
            "/data",  # missing under /
            "/dev/termination-log",
        ],
        exists=present.__contains__,
        isdir=dirs.__contains__,
    )
    assert found == ["/", "/dev", "/run"]


def test_a_mount_point_inside_another_volume_needs_no_mirror() -> None:
    # /tmp/cache is made inside the /tmp volume, so the host's /tmp is not rebuilt.
    found = container.mirrored_dirs(
        ["/tmp", "/tmp/cache"], exists={"/", "/tmp"}.__contains__, isdir=lambda _: True
    )
    assert found == ["/"]


def test_targets_follow_host_symlinks_and_outer_mounts_come_first() -> None:
    links = {"/var/run/secrets/x": "/run/secrets/x"}
    assert container.host_target("/var/run/secrets/x", links.get) == "/run/secrets/x"
    order = container.ordered([Mount("a", "/data/cache"), Mount("b", "/data"), Mount("c", "/")])
    assert [m.target for m in order] == ["/", "/data", "/data/cache"]


def test_kept_paths_come_back_only_where_a_volume_hides_them() -> None:
    mounts = [Mount("v", "/tmp"), Mount("w", "/work/repo")]
    keep = ["/tmp/clone/.venv", "/tmp/clone/.venv/lib", "/usr", "/work/repo", "/work/repo/src"]
    # /usr is not covered; /work/repo is the volume itself (it wins); the venv's lib comes
    # back with the venv.
    assert container.hidden_keeps(keep, mounts) == ["/tmp/clone/.venv", "/work/repo/src"]


def test_a_plan_reads_back_from_json() -> None:
    plan = container.Plan.from_json(
        {
            "argv": ["true"],
            "env": {},
            "root": "/r",
            "mounts": [{"source": "/s", "target": "/t", "read_only": True, "file": False}],
        }
    )
    assert plan.mounts == [Mount("/s", "/t", read_only=True)]
    assert plan.cwd == "/"


# --- pod addresses -----------------------------------------------------------------------


def test_addresses_are_unique_among_live_pods_and_not_reused_at_once() -> None:
    pool = podnet.Addresses(ipaddress.IPv4Network("10.244.3.0/29"))
    first = [pool.take() for _ in range(5)]
    assert first == [f"10.244.3.{i}" for i in range(2, 7)]
    with pytest.raises(RuntimeError, match="no free pod address"):
        pool.take()
    pool.release("10.244.3.3")
    assert pool.take() == "10.244.3.3"
    assert pool.in_use() == set(first)


def test_the_pod_range_is_split_into_one_subnet_per_node() -> None:
    routed = podnet.PodNetwork(ipaddress.IPv4Network("10.244.0.0/16"))
    assert routed.node_cidr(0) == ipaddress.IPv4Network("10.244.0.0/24")
    assert routed.node_cidr(2) == ipaddress.IPv4Network("10.244.2.0/24")
    fallback = podnet.PodNetwork(None)
    assert fallback.node_cidr(1) == ipaddress.IPv4Network("127.2.0.0/16")
    with pytest.raises(ValueError, match="at most 254 nodes"):
        routed.node_cidr(254)


def test_ranges_already_routed_are_found_in_ip_route_output() -> None:
    routes = (
        "local 10.244.0.0/16 dev lo table local scope host\n"
        "10.0.0.0/24 via 192.0.2.1 dev eth0\n"
        "192.10.5.0/24 dev eth1\n"
        "local 110.3.0.0/16 dev lo\n"
    )
    assert podnet.taken_ranges(routes) == {244, 0}


def test_the_bind_shim_env_names_the_pod_address_and_preloads_the_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    env = podnet.pod_env("10.244.0.9", Path("/cache/podnet.so"))
    assert env == {"POLYRL_AGENT_POD_IP": "10.244.0.9", "LD_PRELOAD": "/cache/podnet.so"}
    assert podnet.pod_env("10.244.0.9", None) == {"POLYRL_AGENT_POD_IP": "10.244.0.9"}


# --- probes ------------------------------------------------------------------------------


def test_a_probe_decides_after_its_thresholds_in_a_row() -> None:
    results = iter([True, False, False, True, True])
    prober = probes.Prober(
        "readinessProbe",
        {"successThreshold": 2, "failureThreshold": 2},
        check=lambda timeout: next(results),
    )
    verdicts = [prober.probe(float(t)) for t in range(5)]
    assert verdicts == [None, None, False, False, True]


def test_a_probe_waits_for_its_initial_delay_then_its_period() -> None:
    prober = probes.Prober(
        "livenessProbe",
        {"initialDelaySeconds": 5, "periodSeconds": 2},
        check=lambda timeout: True,
        started=100.0,
    )
    assert not prober.due(104.0)
    assert prober.due(105.0)
    prober.record(True, 105.0)
    assert not prober.due(106.5)
    assert prober.due(107.0)


def test_a_probe_that_cannot_run_counts_as_failed() -> None:
    def broken(timeout: float) -> bool:
        raise ConnectionRefusedError

    prober = probes.Prober("livenessProbe", {"failureThreshold": 1}, check=broken)
    assert prober.probe(0.0) is False


def test_probe_ports_are_resolved_by_name_and_grpc_is_refused() -> None:
    spec: dict[str, Any] = {"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}
    assert probes.port_number("http", spec) == 8080
    assert probes.port_number("9000", spec) == 9000
    with pytest.raises(probes.ProbeError, match="not a port of container 'c'"):
        probes.port_number("metrics", spec)
    with pytest.raises(probes.ProbeError, match="not supported"):
        probes.probers(
            {**spec, "livenessProbe": {"grpc": {"port": 1}}}, "10.0.0.1", lambda cmd, t: True
        )


# --- volumes -----------------------------------------------------------------------------


def test_the_atomic_writer_swaps_a_data_directory_behind_symlinks(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    assert volumes.write_atomic(vol, {"a": (b"1", 0o644), "dir/b": (b"2", 0o600)})
    assert (vol / "a").read_text() == "1"
    assert (vol / "dir" / "b").read_text() == "2"
    assert os.readlink(vol / "a") == "..data/a"
    first = os.readlink(vol / "..data")
    assert not volumes.write_atomic(vol, {"a": (b"1", 0o644), "dir/b": (b"2", 0o600)})
    assert volumes.write_atomic(vol, {"a": (b"3", 0o644)})
    assert (vol / "a").read_text() == "3"
    assert not (vol / "dir").exists()  # a key that went away goes away
    assert not (vol / first).exists()  # the old data directory is removed
    assert ((vol / "..data" / "a").stat().st_mode & 0o777) == 0o644


def test_keyed_volumes_pick_items_and_wait_for_what_is_missing() -> None:
    data = {"k1": "one", "k2": "two"}
    files = volumes._keyed_files(
        data,
        {"items": [{"key": "k2", "path": "sub/x", "mode": 0o400}]},
        what="cm",
        decode=False,
        default_mode=0o644,
    )
    assert files == {"sub/x": (b"two", 0o400)}
    with pytest.raises(volumes.NotReady, match="cm not found"):
        volumes._keyed_files(None, {}, what="cm", decode=False, default_mode=0o644)
    assert (
        volumes._keyed_files(None, {"optional": True}, what="cm", decode=False, default_mode=0)
        == {}
    )
    with pytest.raises(volumes.NotReady, match="has no key 'k3'"):
        volumes._keyed_files(
            data, {"items": [{"key": "k3", "path": "p"}]}, what="cm", decode=False, default_mode=0
        )


def test_a_token_is_refreshed_at_80_percent_of_its_life_or_its_max_age() -> None:
    issued = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    token = volumes.Token("t", issued, issued + datetime.timedelta(seconds=1000))

    def at(seconds: float) -> datetime.datetime:
        return issued + datetime.timedelta(seconds=seconds)

    assert not volumes.needs_refresh(token, at(799), max_age=3600)
    assert volumes.needs_refresh(token, at(800), max_age=3600)
    assert volumes.needs_refresh(token, at(10), max_age=5)


def test_sub_paths_must_stay_inside_the_volume(tmp_path: Path) -> None:
    spec = {"volumeMounts": [{"name": "v", "mountPath": "/m", "subPath": "a/b"}]}
    (mount,) = volumes.container_mounts(spec, lambda name: tmp_path)
    assert mount["source"] == str(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    escape = {"volumeMounts": [{"name": "v", "mountPath": "/m", "subPath": "../up"}]}
    with pytest.raises(volumes.Unsupported, match="relative path inside the volume"):
        volumes.container_mounts(escape, lambda name: tmp_path)


def test_downward_volumes_write_labels_in_the_kubelet_format() -> None:
    pod = {"metadata": {"labels": {"b": "2", "a": "x y"}}}
    assert podenv.field_value(pod, "metadata.labels") == 'a="x y"\nb="2"'


# --- the runner's helpers -----------------------------------------------------------------


def test_the_hosts_file_names_the_pod_and_its_subdomain() -> None:
    pod = {
        "metadata": {"namespace": "ml"},
        "spec": {
            "subdomain": "trainers",
            "hostAliases": [{"ip": "10.1.1.1", "hostnames": ["nats"]}],
        },
    }
    text = runner.hosts_file(pod, "10.244.0.7", "job-trainer-0")
    assert (
        "10.244.0.7\tjob-trainer-0.trainers.ml.svc.cluster.local job-trainer-0 "
        "job-trainer-0.trainers\n"
    ) in text
    assert "127.0.0.1\tlocalhost\n" in text
    assert text.endswith("10.1.1.1\tnats\n")


def test_the_hosts_file_stands_in_for_the_dns_of_the_pods_headless_service() -> None:
    pod = {"metadata": {"namespace": "ml"}, "spec": {"subdomain": "trainers"}}
    peers = [("10.244.0.9", "job-trainer-1")]
    text = runner.hosts_file(pod, "10.244.0.7", "job-trainer-0", peers)
    assert text.endswith(
        "10.244.0.9\tjob-trainer-1.trainers.ml.svc.cluster.local job-trainer-1.trainers\n"
    )
    # Without a subdomain there is no Service to stand in for.
    lone = runner.hosts_file({"metadata": {"namespace": "ml"}, "spec": {}}, "10.0.0.1", "a", peers)
    assert "job-trainer-1" not in lone


def test_a_termination_message_comes_from_its_file_first_then_the_log_on_error(
    tmp_path: Path,
) -> None:
    message, log = tmp_path / "msg", tmp_path / "log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(100)))
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    message.write_bytes(b"")
    tail = runner.termination_message(fallback, message, log, exit_code=1)
    assert tail.splitlines()[0] == "line 20"
    assert tail.endswith("line 99\n")
    assert runner.termination_message(fallback, message, log, exit_code=0) == ""
    assert runner.termination_message({}, message, log, exit_code=1) == ""
    message.write_bytes(b"x" * 5000)
    assert runner.termination_message(fallback, message, log, exit_code=1) == "x" * 4096


def test_death_by_signal_is_reported_as_128_plus_the_signal() -> None:
    assert runner.exit_status(-15) == 143
    assert runner.exit_status(-9) == 137
    assert runner.exit_status(3) == 3


def test_log_tails_take_lines_then_bytes() -> None:
    data = b"a\nb\nc\n"
    assert kubeletapi.tail(data, 2, None) == b"b\nc\n"
    assert kubeletapi.tail(data, 0, None) == b""
    assert kubeletapi.tail(data, None, 3) == b"a\nb"
    assert kubeletapi.tail(data, 2, 1) == b"b"
