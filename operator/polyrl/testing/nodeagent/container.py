"""Start one container's process in a file system view of its own (run as a script, as root).

    python -I container.py PLAN.json

The node agent has no container runtime and no images: a pod's process runs on the host's
file system, with the host's Python environment. What a kubelet adds on top of an image,
this launcher adds on top of the host: in a new mount namespace (and UTS namespace, for the
pod's hostname) it builds a root that mirrors the host's, mounts the pod's volumes at their
`mountPath`s (the service-account token at /var/run/secrets/kubernetes.io/serviceaccount,
emptyDirs, ConfigMaps, Secrets, PVCs), the termination-message file and the pod's
/etc/hosts, then chroots there and execs the container's command in place, so the process
keeps the PID the agent started.

Nothing on the host changes: mount propagation is private, and where a mount point does
not exist on the host (say /var/run/secrets/...), the directory that would hold it is
mirrored in a tmpfs (each entry bound from the host) instead of being created on the host.
With `readOnlyRoot`, everything but the volumes, /dev, /proc and /sys is read-only. Host
paths in `keep` (the agent's interpreter and virtualenv, the pod's sandbox) stay visible even
where a volume covers them: a test clone under /tmp must still run inside a pod that mounts
an emptyDir at /tmp.

Standard library only (it runs with `python -I` before anything else): the planning
functions are pure and unit-tested; `main` performs the plan.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
SETUP_FAILED = 120  # exit status when the view cannot be built (the agent reports it)
KERNEL_TREES = ("/dev", "/proc", "/sys")  # writable even under a read-only root


@dataclass(slots=True)
class Mount:
    """One bind mount: a host path at `target` inside the container."""

    source: str
    target: str
    read_only: bool = False
    file: bool = False  # a single file (the termination log, /etc/hosts), not a directory


@dataclass(slots=True)
class Plan:
    argv: list[str]
    env: dict[str, str]
    root: str  # an empty host directory; the new root is a tmpfs mounted on it
    cwd: str = "/"
    hostname: str | None = None
    mounts: list[Mount] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)
    read_only_root: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        mounts = [Mount(**m) for m in data.pop("mounts", [])]
        return cls(mounts=mounts, **data)


def _norm(path: str) -> str:
    return str(PurePosixPath("/") / path)


def _parents(path: str) -> list[str]:
    """'/a/b/c' -> ['/', '/a', '/a/b'] (outermost first)."""
    parts = PurePosixPath(path).parts
    return [str(PurePosixPath(*parts[:i])) for i in range(1, len(parts))]


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def host_target(target: str, realpath: Any = os.path.realpath) -> str:
    """Where `target` lands when symlinks on the host are followed (/var/run -> /run)."""
    return _norm(realpath(_norm(target)))


def mirrored_dirs(
    targets: list[str], exists: Any = os.path.lexists, isdir: Any = os.path.isdir
) -> list[str]:
    """Host directories to rebuild in tmpfs so that every target gets a mount point
    without creating anything on the host: for a target whose parent is missing on the
    host, every directory from / down to its deepest existing ancestor. `/` is always
    rebuilt (the new root itself). Outermost first."""
    found = {"/"}
    for target in targets:
        inside_another = any(under(target, t) and target != t for t in targets)
        if inside_another or exists(target):
            continue
        chain = _parents(target)
        existing = [d for d in chain if exists(d) and isdir(d)]
        for directory in chain:
            if directory in existing:
                found.add(directory)
    return sorted(found, key=lambda d: (d.count("/") if d != "/" else 0, d))


def ordered(mounts: list[Mount]) -> list[Mount]:
    """Outer mounts first, so /data and then /data/cache both take effect."""
    return sorted(mounts, key=lambda m: len(PurePosixPath(m.target).parts))


def hidden_keeps(keep: list[str], mounts: list[Mount]) -> list[str]:
    """The kept host paths that some mount covers, and so must be bound again on top
    (outermost first; one whose kept ancestor is bound again comes back with it)."""
    hidden = sorted(
        {p for p in keep if any(under(p, m.target) and p != m.target for m in mounts)},
        key=lambda p: (len(PurePosixPath(p).parts), p),
    )
    chosen: list[str] = []
    for path in hidden:
        if not any(under(path, outer) for outer in chosen):
            chosen.append(path)
    return chosen


# --- performing the plan (Linux, root) -------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    src = source.encode() if source else None
    fs = fstype.encode() if fstype else None
    _check(_libc.mount(src, target.encode(), fs, flags, None), f"mount {source} on {target}")


def _bind(source: str, target: str, *, read_only: bool = False) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def _mount_point(path: str, *, file: bool) -> None:
    if file:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.lexists(path):
            open(path, "a").close()
    else:
        os.makedirs(path, exist_ok=True)


def _mirror(directory: str, root: str, mirrored: set[str], read_only: bool) -> None:
    """Rebuild host `directory` at root+directory: its entries bound from the host, its
    mirrored subdirectories rebuilt the same way, symlinks copied."""
    inside = root + directory.rstrip("/")
    os.makedirs(inside or root, exist_ok=True)
    for name in sorted(os.listdir(directory)):
        host = os.path.join(directory, name)
        here = f"{inside}/{name}"
        if host in mirrored:
            _mirror(host, root, mirrored, read_only)
        elif os.path.islink(host):
            os.symlink(os.readlink(host), here)
        else:  # directories, files and device nodes (/dev/urandom) alike
            _mount_point(here, file=not os.path.isdir(host))
            kernel = any(under(host, t) for t in KERNEL_TREES)
            _bind(host, here, read_only=read_only and not kernel)


def build(plan: Plan) -> None:
    mounts = [
        Mount(m.source, host_target(m.target), m.read_only, m.file) for m in ordered(plan.mounts)
    ]
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = plan.root.rstrip("/")
    _mount("tmpfs", root, "tmpfs", 0)
    targets = [m.target for m in mounts]
    mirrored = set(mirrored_dirs(targets))
    _mirror("/", root, mirrored, plan.read_only_root)
    # The host directory bound at root/tmp (say) holds the new root's own mount point, and a
    # recursive bind copied the half-built root there: take that copy away again.
    _libc.umount2((root + root).encode(), MNT_DETACH)
    for mount in mounts:
        _mount_point(root + mount.target, file=mount.file)
        _bind(mount.source, root + mount.target, read_only=mount.read_only)
    for path in hidden_keeps(plan.keep, mounts):
        _mount_point(root + path, file=not os.path.isdir(path))
        _bind(path, root + path, read_only=plan.read_only_root)
    if plan.read_only_root:
        _mount(None, root, None, MS_REMOUNT | MS_RDONLY)
    if plan.hostname:
        name = plan.hostname.encode()
        _check(_libc.sethostname(name, len(name)), "sethostname")
    os.chroot(root)
    os.chdir(plan.cwd)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -I container.py PLAN.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        plan = Plan.from_json(json.load(f))
    try:
        build(plan)
    except OSError as err:
        print(f"polyrl node agent: cannot set up the container: {err}", file=sys.stderr)
        return SETUP_FAILED
    try:
        os.execvpe(plan.argv[0], plan.argv, plan.env)
    except OSError as err:
        print(f"polyrl node agent: cannot run {plan.argv[0]!r}: {err}", file=sys.stderr)
        return 127 if isinstance(err, FileNotFoundError) else 126
    return 0  # unreachable: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv))
