"""A pod IP per pod: an address range routed to loopback, and the bind() shim that uses it.

A real node gives each pod a network namespace and an address from the node's pod CIDR. The
agent's pods share the host's network namespace (so they reach the API server and NATS on
127.0.0.1 as the tests start them), but each still gets an address of its own: the agent
claims a free /16 in 10.0.0.0/8 (10.244.0.0/16 unless taken) and routes all of it to the
loopback device as local (`ip route add local <range> dev lo`, the "AnyIP" route), so any
address in it can be bound and reached on this host. Node k's pods get addresses from the
k-th /24 of that range, reported as `status.podIP`: endpoint slices take them (they refuse
127.0.0.0/8). A running pod's address is also added to the loopback device (for software
that looks up the interface of an address, such as Gloo). The route and the addresses are
removed when the agent stops. Where it cannot be added (no `ip`
command, no CAP_NET_ADMIN), pods get 127.(k+1).x.y instead, and a warning says endpoint
slices will not list them.

A pod's processes run with `LD_PRELOAD=podnet.so` and `POLYRL_AGENT_POD_IP`, which turn a
listen on the wildcard address into a listen on the pod's address: two pods can serve the
same port, each at its own IP (see podnet.c). A process that binds 127.0.0.1 explicitly
still shares the host's ports. The shim is compiled once with the system C compiler into
the tools cache, keyed by the hash of its source; without a compiler, pods still get
addresses but listen on the host's wildcard (logged as a warning).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path

from polyrl.testing import tools

log = logging.getLogger("polyrl.nodeagent")

POD_IP_ENV = "POLYRL_AGENT_POD_IP"
HOST_IP = "127.0.0.1"


RECORD = "pod-network"  # the claimed range, in the agent's workdir, until it is released
FIRST_RANGE = 244  # 10.244.0.0/16 first, then 10.243.0.0/16, ... down to 10.200.0.0/16
LAST_RANGE = 200


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def taken_ranges(routes: str) -> set[int]:
    """Second octets N of 10.N.x.y that appear in `ip route` output."""
    return {int(m) for m in re.findall(r"(?<![\d.])10\.(\d{1,3})\.", routes)}


class PodNetwork:
    """The cluster's pod addresses: one routed range, or the loopback fallback."""

    def __init__(self, cidr: ipaddress.IPv4Network | None) -> None:
        self.cidr = cidr  # None: 127.(k+1).0.0/16 per node, no route
        self.record_path: Path | None = None

    @classmethod
    def claim(cls) -> PodNetwork:
        """Route the first free 10.N.0.0/16 to loopback; fall back to 127.x without one."""
        if shutil.which("ip") is None:
            log.warning("no `ip` command: pod IPs come from 127.0.0.0/8 (no endpoint slices)")
            return cls(None)
        taken = taken_ranges(_ip("-4", "route", "show", "table", "all").stdout)
        for n in range(FIRST_RANGE, LAST_RANGE - 1, -1):
            if n in taken:
                continue
            cidr = ipaddress.IPv4Network(f"10.{n}.0.0/16")
            added = _ip("route", "add", "local", str(cidr), "dev", "lo")
            if added.returncode == 0:
                return cls(cidr)
            log.warning(
                "cannot route %s to loopback (%s): pod IPs come from 127.0.0.0/8 "
                "(no endpoint slices)",
                cidr,
                added.stderr.strip(),
            )
            return cls(None)
        log.warning("no free 10.N.0.0/16 for pods: pod IPs come from 127.0.0.0/8")
        return cls(None)

    def node_cidr(self, index: int) -> ipaddress.IPv4Network:
        """Node `index`'s pod CIDR: the index-th /24 of the range (or 127.(index+1)/16)."""
        if not 0 <= index < 254:
            raise ValueError(f"a node agent holds at most 254 nodes, not {index + 1}")
        if self.cidr is None:
            return ipaddress.IPv4Network(f"127.{index + 1}.0.0/16")
        return list(self.cidr.subnets(new_prefix=24))[index]

    def record(self, path: Path) -> None:
        """Note the claimed range, so whoever stops a killed agent can release it."""
        self.record_path = path
        if self.cidr is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(self.cidr))

    def attach(self, ip: str) -> None:
        """Put a running pod's address on the loopback device as well: the route already
        makes it reachable, but software that looks for the interface holding an address
        (Gloo, which torch.distributed uses on CPU) finds it only there."""
        if self.cidr is not None and ipaddress.IPv4Address(ip) in self.cidr:
            added = _ip("addr", "add", f"{ip}/32", "dev", "lo")
            if added.returncode != 0 and "File exists" not in added.stderr:
                log.warning("cannot add %s to lo: %s", ip, added.stderr.strip())

    def detach(self, ip: str) -> None:
        if self.cidr is not None and ipaddress.IPv4Address(ip) in self.cidr:
            _ip("addr", "del", f"{ip}/32", "dev", "lo")

    def release(self) -> None:
        if self.cidr is not None:
            _drop(str(self.cidr))
            self.cidr = None
        if self.record_path is not None:
            self.record_path.unlink(missing_ok=True)


def _drop(cidr: str) -> None:
    _ip("-4", "addr", "flush", "dev", "lo", "to", cidr)
    _ip("route", "del", "local", cidr, "dev", "lo")


def release_recorded(path: Path) -> None:
    """Remove the route and addresses a (killed) agent recorded in `path`."""
    if path.is_file():
        _drop(path.read_text().strip())
        path.unlink()


class Addresses:
    """Hands out the addresses of one node's CIDR, never two live pods the same one, and
    not a just-released one again before the rest of the range was used (as a CNI's IPAM
    avoids quick reuse)."""

    def __init__(self, cidr: ipaddress.IPv4Network) -> None:
        self.cidr = cidr
        self._hosts = list(cidr.hosts())[1:]  # .0.1 is the network's "gateway"
        self._next = 0
        self._used: set[str] = set()
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            for _ in range(len(self._hosts)):
                ip = str(self._hosts[self._next])
                self._next = (self._next + 1) % len(self._hosts)
                if ip not in self._used:
                    self._used.add(ip)
                    return ip
        raise RuntimeError(f"no free pod address left in {self.cidr}")

    def release(self, ip: str) -> None:
        with self._lock:
            self._used.discard(ip)

    def in_use(self) -> set[str]:
        with self._lock:
            return set(self._used)


def _source() -> bytes:
    return resources.files("polyrl.testing.nodeagent").joinpath("podnet.c").read_bytes()


def shim_path() -> Path:
    digest = hashlib.sha256(_source()).hexdigest()[:12]
    return tools.tools_dir() / f"podnet-{digest}" / "podnet.so"


def build_shim() -> Path | None:
    """The compiled shim (built now if missing), or None where no C compiler exists."""
    target = shim_path()
    if target.is_file():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: pods get addresses but listen on the host's wildcard")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source = Path(tmp) / "podnet.c"
        source.write_bytes(_source())
        built = Path(tmp) / "podnet.so"
        cmd = [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log.warning("building %s failed: %s", target.name, proc.stderr.strip())
            return None
        built.replace(target)  # atomic: a concurrent build leaves one whole file
    return target


def pod_env(ip: str, shim: Path | None) -> dict[str, str]:
    """What a pod's processes need to listen on `ip`."""
    if shim is None:
        return {POD_IP_ENV: ip}
    preload = " ".join(p for p in (str(shim), os.environ.get("LD_PRELOAD", "")) if p)
    return {POD_IP_ENV: ip, "LD_PRELOAD": preload}
