"""Which weight objects exist, which a replica fetches, and which the trainer may delete.

The trainer publishes a delta from the previous version for every version and a keyframe (every
tensor whole) every K versions. A replica at version `have` can apply the chain of deltas up to the
latest version, or load a keyframe and apply the (shorter) chain after it; for a replica far behind,
the keyframe is fewer bytes. `plan_sync` picks the fewest bytes, `to_delete` decides retention so
that no replica that is still alive loses its way to the latest version. Pure functions of object
names and sizes, so the policy is tested without NATS; object names say everything needed:

    v000000000012.delta.from000000000011    the delta 11 -> 12
    v000000000010.key                       the keyframe of version 10

Zero-padded so that names sort by version in any listing. Names that do not parse are someone
else's objects: never planned over, never deleted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

_NAME = re.compile(r"^v(\d{12})(?:\.delta\.from(\d{12})|\.key)$")


class NoPath(LookupError):
    """No chain of available objects leads to the version asked for."""


@dataclasses.dataclass(frozen=True, slots=True)
class WeightObject:
    name: str
    version: int  # the version the target holds once this object is applied
    base: int | None  # None: a keyframe
    size: int

    @property
    def is_keyframe(self) -> bool:
        return self.base is None


def delta_name(base: int, new: int) -> str:
    if not 0 <= base < new:
        raise ValueError(f"a delta goes forward: {base} -> {new}")
    return f"v{new:012d}.delta.from{base:012d}"


def keyframe_name(version: int) -> str:
    if version < 0:
        raise ValueError(f"negative version {version}")
    return f"v{version:012d}.key"


def parse(name: str, size: int = 0) -> WeightObject | None:
    match = _NAME.match(name)
    if match is None:
        return None
    version, base = match.groups()
    return WeightObject(name, int(version), None if base is None else int(base), size)


def is_keyframe_version(version: int, keyframe_every: int) -> bool:
    """Keyframes at 0, K, 2K, ...: version 0 has no delta, so it is always one."""
    if keyframe_every < 1:
        raise ValueError(f"keyframe_every must be at least 1, not {keyframe_every}")
    return version % keyframe_every == 0


def plan_sync(
    have: int | None,
    latest: int,
    available: Mapping[str, int],
    avoid: Iterable[str] = (),
) -> list[str]:
    """Object names to apply, in order, to go from `have` (None: nothing held) to `latest`.

    The cheapest in bytes (then in objects) among: the delta chain from `have`, and any keyframe at
    or below `latest` followed by its delta chain. A replica that holds nothing, or a version above
    `latest` (another trainer epoch), starts from a keyframe. Objects named in `avoid` (refused
    before) are not used. Raises `NoPath` when nothing reaches `latest`.
    """
    if have == latest:
        return []
    best = _cheapest_paths(have, latest, _usable(available, latest, set(avoid)))
    if latest not in best:
        start = "nothing" if have is None else f"version {have}"
        raise NoPath(f"no chain of available objects from {start} to version {latest}")
    return list(best[latest][2])


_Path = tuple[int, int, tuple[str, ...]]  # bytes, objects, names


def _usable(available: Mapping[str, int], latest: int, avoid: set[str]) -> list[WeightObject]:
    parsed = (parse(name, size) for name, size in available.items() if name not in avoid)
    return [obj for obj in parsed if obj is not None and obj.version <= latest]


def _cheapest_paths(have: int | None, latest: int, objects: list[WeightObject]) -> dict[int, _Path]:
    """Cheapest way to every version: versions only grow along deltas, so one ascending sweep."""
    best: dict[int, _Path] = {}
    if have is not None and have < latest:
        best[have] = (0, 0, ())
    for obj in objects:
        if obj.is_keyframe:
            _offer(best, obj.version, (obj.size, 1, (obj.name,)))
    out_of: dict[int, list[WeightObject]] = {}
    for obj in objects:
        if obj.base is not None:
            out_of.setdefault(obj.base, []).append(obj)
    for version in sorted(set(best) | set(out_of)):
        if version not in best:
            continue
        cost, count, names = best[version]
        for delta in out_of.get(version, ()):
            _offer(best, delta.version, (cost + delta.size, count + 1, (*names, delta.name)))
    return best


def _offer(best: dict[int, _Path], version: int, path: _Path) -> None:
    if version not in best or path[:2] < best[version][:2]:
        best[version] = path


def to_delete(
    objects: Mapping[str, int],
    live_versions: Iterable[int],
    keep_keyframes: int = 2,
) -> set[str]:
    """Objects the trainer may delete without costing any live replica a byte.

    Kept: the newest `keep_keyframes` keyframes (at least one) with their delta chains to the
    latest version (an older keyframe is the fallback when a newer one is refused), the plan of a
    new replica, and the plan of a replica at each live version. Since every kept plan survives,
    no replica's cheapest way to the latest version gets more expensive. Only names that parse
    are ever returned.
    """
    parsed = [obj for name, size in objects.items() if (obj := parse(name, size)) is not None]
    if not parsed:
        return set()
    latest = max(obj.version for obj in parsed)
    keep: set[str] = set()
    deltas_only = {obj.name: obj.size for obj in parsed if not obj.is_keyframe}
    keyframes = sorted((obj for obj in parsed if obj.is_keyframe), key=lambda obj: -obj.version)
    for keyframe in keyframes[: max(1, keep_keyframes)]:
        keep.add(keyframe.name)
        keep.update(_plan_or_nothing(keyframe.version, latest, deltas_only))
    for have in {None, *live_versions}:
        keep.update(_plan_or_nothing(have, latest, objects))
    return {obj.name for obj in parsed} - keep


def _plan_or_nothing(have: int | None, latest: int, available: Mapping[str, int]) -> list[str]:
    try:
        return plan_sync(have, latest, available)
    except NoPath:
        return []
