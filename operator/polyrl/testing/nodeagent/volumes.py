"""A pod's volumes as host directories, the way the kubelet's volume manager prepares them.

Each volume of the pod spec becomes a directory on the host that the container launcher
bind-mounts at every `mountPath` naming it:

- `emptyDir`: a directory in the pod's sandbox; with `medium: Memory`, one under /dev/shm
  (memory-backed; `sizeLimit` is not enforced);
- `configMap`, `secret`, `downwardAPI` and `projected` (ConfigMaps, Secrets, the downward
  API and service-account tokens, the last from the TokenRequest API and bound to the pod):
  files written the kubelet's way (a timestamped directory behind a `..data` symlink,
  swapped atomically), re-synced by `refresh()`, the token re-requested once 80 % of its
  lifetime has passed (or after `token_max_age`);
- `persistentVolumeClaim`: the host directory of the PersistentVolume bound to the claim
  (`hostPath` or `local`; the test provisioner makes such volumes);
- `hostPath`: the path itself (`DirectoryOrCreate` and `FileOrCreate` create it).

Any other volume type is an error naming it. A volume that cannot be set up yet (a missing
ConfigMap, an unbound claim) raises `NotReady`; the runner retries, as a kubelet does, and
reports the reason in the container's waiting state.
"""

from __future__ import annotations

import base64
import datetime
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from polyrl.local import podenv

REFRESH_FRACTION = 0.8  # re-request a token once this much of its lifetime has passed
SHM_ROOT = Path("/dev/shm/polyrl-node-agent")


class NotReady(Exception):
    """A volume cannot be set up yet; the pod waits (retried like the kubelet's)."""


class Unsupported(ValueError):
    """The pod asks for something the node agent does not do; the pod fails."""


@dataclass(frozen=True, slots=True)
class Token:
    value: str
    issued: datetime.datetime
    expires: datetime.datetime


class Source(Protocol):
    """What the volumes read from the API server."""

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None: ...

    def secret(self, namespace: str, name: str) -> Mapping[str, str] | None: ...

    def token(self, pod: Mapping[str, Any], *, audience: str | None, seconds: int) -> Token: ...

    def claim_path(self, namespace: str, claim: str) -> str | None: ...


def needs_refresh(token: Token, now: datetime.datetime, max_age: float) -> bool:
    """The kubelet's rule: refresh after 80 % of the lifetime, or when older than max_age."""
    life = (token.expires - token.issued).total_seconds()
    age = (now - token.issued).total_seconds()
    return age >= REFRESH_FRACTION * life or age >= max_age


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# --- the kubelet's atomic writer --------------------------------------------------------


def write_atomic(directory: Path, files: Mapping[str, tuple[bytes, int]]) -> bool:
    """Make `directory` hold exactly `files` (relative path -> (content, mode)).

    As the kubelet does: the files live in a fresh `..<timestamp>` directory, `..data`
    points at it (replaced by a rename, so readers never see half an update), and each
    top-level name is a symlink through `..data`. Returns False when nothing changed."""
    directory.mkdir(parents=True, exist_ok=True)
    if _current(directory) == {k: v[0] for k, v in files.items()}:
        return False
    stamp = now().strftime("..%Y_%m_%d_%H_%M_%S.%f")
    data = directory / stamp
    for rel, (content, mode) in files.items():
        path = data / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    tmp = directory / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(stamp)
    tmp.rename(directory / "..data")
    tops = {rel.split("/", 1)[0] for rel in files}
    for entry in directory.iterdir():
        if not entry.name.startswith("..") and entry.name not in tops:
            entry.unlink()
    for top in tops:
        if not (directory / top).is_symlink():
            (directory / top).symlink_to(f"..data/{top}")
    if old:
        shutil.rmtree(directory / old, ignore_errors=True)
    return True


def _current(directory: Path) -> dict[str, bytes] | None:
    data = directory / "..data"
    if not data.is_dir():
        return None
    return {str(p.relative_to(data)): p.read_bytes() for p in data.rglob("*") if p.is_file()}


# --- what each volume type holds --------------------------------------------------------


def _mode(item: Mapping[str, Any], default: int) -> int:
    return int(item.get("mode", default))


def _keyed_files(
    data: Mapping[str, str] | None,
    spec: Mapping[str, Any],
    *,
    what: str,
    decode: bool,
    default_mode: int,
) -> dict[str, tuple[bytes, int]]:
    """Files of a ConfigMap or Secret volume (or projection): every key, or `items`."""
    if data is None:
        if spec.get("optional", False):
            return {}
        raise NotReady(f"{what} not found")

    def raw(key: str) -> bytes:
        value = data[key]
        return base64.b64decode(value) if decode else value.encode()

    items = spec.get("items")
    if not items:
        return {key: (raw(key), default_mode) for key in data}
    files = {}
    for item in items:
        if item["key"] not in data:
            if spec.get("optional", False):
                continue
            raise NotReady(f"{what} has no key {item['key']!r}")
        files[item["path"]] = (raw(item["key"]), _mode(item, default_mode))
    return files


def _downward_files(
    pod: Mapping[str, Any], items: list[Mapping[str, Any]], default_mode: int
) -> dict[str, tuple[bytes, int]]:
    files = {}
    for item in items:
        if "fieldRef" in item:
            value = podenv.field_value(pod, item["fieldRef"]["fieldPath"])
        else:
            value = podenv.resource_field(pod, item["resourceFieldRef"])
        files[item["path"]] = (value.encode(), _mode(item, default_mode))
    return files


@dataclass(slots=True)
class Volume:
    """One volume of a pod: where it lives on the host, and how to (re)fill it."""

    name: str
    path: Path
    spec: Mapping[str, Any]
    kind: str
    token: Token | None = None
    managed: bool = False  # made by the agent (removed with the pod), not a host path

    def fill(self, pod: Mapping[str, Any], source: Source, max_age: float) -> bool:
        """Write the volume's current contents; True when something changed."""
        files = self.contents(pod, source, max_age)
        return False if files is None else write_atomic(self.path, files)

    def contents(
        self, pod: Mapping[str, Any], source: Source, max_age: float
    ) -> dict[str, tuple[bytes, int]] | None:
        ns = pod["metadata"]["namespace"]
        spec = self.spec
        mode = int(spec.get("defaultMode", 0o644))
        if self.kind == "configMap":
            data = source.config_map(ns, spec["name"])
            return _keyed_files(
                data, spec, what=f"configmap {ns}/{spec['name']}", decode=False, default_mode=mode
            )
        if self.kind == "secret":
            data = source.secret(ns, spec["secretName"])
            return _keyed_files(
                data, spec, what=f"secret {ns}/{spec['secretName']}", decode=True, default_mode=mode
            )
        if self.kind == "downwardAPI":
            return _downward_files(pod, spec.get("items") or [], mode)
        if self.kind == "projected":
            return self._projected(pod, source, max_age, mode)
        return None

    def _projected(
        self, pod: Mapping[str, Any], source: Source, max_age: float, mode: int
    ) -> dict[str, tuple[bytes, int]]:
        ns = pod["metadata"]["namespace"]
        files: dict[str, tuple[bytes, int]] = {}
        for item in self.spec.get("sources") or []:
            if "serviceAccountToken" in item:
                files.update(self._token_file(pod, source, item["serviceAccountToken"], max_age))
            elif "configMap" in item:
                cm = item["configMap"]
                files.update(
                    _keyed_files(
                        source.config_map(ns, cm["name"]),
                        cm,
                        what=f"configmap {ns}/{cm['name']}",
                        decode=False,
                        default_mode=mode,
                    )
                )
            elif "secret" in item:
                sec = item["secret"]
                files.update(
                    _keyed_files(
                        source.secret(ns, sec["name"]),
                        sec,
                        what=f"secret {ns}/{sec['name']}",
                        decode=True,
                        default_mode=mode,
                    )
                )
            elif "downwardAPI" in item:
                files.update(_downward_files(pod, item["downwardAPI"].get("items") or [], mode))
            else:
                raise Unsupported(f"projected source {sorted(item)} is not supported")
        return files

    def _token_file(
        self, pod: Mapping[str, Any], source: Source, spec: Mapping[str, Any], max_age: float
    ) -> dict[str, tuple[bytes, int]]:
        if self.token is None or needs_refresh(self.token, now(), max_age):
            self.token = source.token(
                pod,
                audience=spec.get("audience"),
                seconds=int(spec.get("expirationSeconds", 3600)),
            )
        mode = int(self.spec.get("defaultMode", 0o644))
        return {spec["path"]: (self.token.value.encode(), mode)}


def _claim_dir(pod: Mapping[str, Any], spec: Mapping[str, Any], source: Source) -> Path:
    ns = pod["metadata"]["namespace"]
    path = source.claim_path(ns, spec["claimName"])
    if path is None:
        raise NotReady(f"persistentvolumeclaim {ns}/{spec['claimName']} is not bound")
    return Path(path)


def _host_path(spec: Mapping[str, Any]) -> Path:
    path = Path(spec["path"])
    kind = spec.get("type", "")
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate" and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    elif kind in ("Directory", "File") and not path.exists():
        raise NotReady(f"hostPath {path} does not exist")
    return path


FILLED = ("configMap", "secret", "downwardAPI", "projected")


@dataclass(slots=True)
class PodVolumes:
    """Every volume of one pod, set up in `sandbox` (and /dev/shm for memory-backed ones)."""

    pod: Mapping[str, Any]
    sandbox: Path
    source: Source
    token_max_age: float = 24 * 3600.0
    volumes: dict[str, Volume] = field(default_factory=dict)

    @property
    def shm_dir(self) -> Path:
        return SHM_ROOT / str(self.pod["metadata"]["uid"])

    def set_up(self) -> None:
        """Prepare every volume; raises NotReady (retry later) or Unsupported (fail)."""
        for spec in self.pod["spec"].get("volumes") or []:
            if spec["name"] not in self.volumes:
                self.volumes[spec["name"]] = self._make(spec)
        for volume in self.volumes.values():
            if volume.kind in FILLED:
                volume.fill(self.pod, self.source, self.token_max_age)

    def _make(self, spec: Mapping[str, Any]) -> Volume:
        name = spec["name"]
        kinds = [k for k in spec if k != "name"]
        kind = kinds[0] if len(kinds) == 1 else "/".join(sorted(kinds))
        own = self.sandbox / "volumes" / name
        if kind == "emptyDir":
            memory = (spec["emptyDir"] or {}).get("medium") == "Memory"
            path = self.shm_dir / name if memory else own
            path.mkdir(parents=True, exist_ok=True)
            return Volume(name, path, spec["emptyDir"] or {}, kind, managed=True)
        if kind in FILLED:
            return Volume(name, own, spec[kind] or {}, kind, managed=True)
        if kind == "persistentVolumeClaim":
            return Volume(name, _claim_dir(self.pod, spec[kind], self.source), spec[kind], kind)
        if kind == "hostPath":
            return Volume(name, _host_path(spec[kind]), spec[kind], kind)
        raise Unsupported(f"volume {name!r}: type {kind!r} is not supported by the node agent")

    def refresh(self) -> list[str]:
        """Re-sync ConfigMap, Secret, downward API and token contents; the names changed."""
        changed = []
        for volume in self.volumes.values():
            if volume.kind in FILLED:
                try:
                    if volume.fill(self.pod, self.source, self.token_max_age):
                        changed.append(volume.name)
                except NotReady:
                    continue  # the kubelet keeps the last contents when a source vanishes
        return changed

    def path_of(self, name: str) -> Path:
        if name not in self.volumes:
            raise Unsupported(f"volumeMount names volume {name!r}, which the pod does not have")
        return self.volumes[name].path

    def remove(self) -> None:
        shutil.rmtree(self.shm_dir, ignore_errors=True)


# --- mounts of one container -------------------------------------------------------------

Resolve = Callable[[str], Path]


def container_mounts(container: Mapping[str, Any], path_of: Resolve) -> list[dict[str, Any]]:
    """The container's volumeMounts as launcher mounts (source on the host, target inside).
    `subPath` picks a directory inside the volume (created if missing, as the kubelet does)."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        source = path_of(mount["name"])
        if sub := mount.get("subPath"):
            if ".." in Path(sub).parts or Path(sub).is_absolute():
                raise Unsupported(f"subPath {sub!r} must be a relative path inside the volume")
            source = source / sub
            if not source.exists():
                source.mkdir(parents=True)
        mounts.append(
            {
                "source": str(source),
                "target": mount["mountPath"],
                "read_only": bool(mount.get("readOnly", False)),
                "file": source.is_file(),
            }
        )
    return mounts
