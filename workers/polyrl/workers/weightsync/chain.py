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

A sharded trainer (`trainer.strategy: fsdp2`) stores each object in parts, one per rank, each
that rank's rows of every tensor (`pieces`):

    v000000000012.delta.from000000000011.part001of002

An object in parts is planned over as one (`fold`: its size is theirs summed) once all of its
parts are there; the parts of a set that stays incomplete (a trainer stopped while writing it)
are deleted once a later version is complete.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

_NAME = re.compile(r"^v(\d{12})(?:\.delta\.from(\d{12})|\.key)$")
_PART = re.compile(r"^(.+)\.part(\d{3})of(\d{3})$")
MAX_PARTS = 999


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


def part_name(name: str, index: int, count: int) -> str:
    """The name of part `index` of `count` of the object `name` (a single part: `name`)."""
    if not 0 <= index < count <= MAX_PARTS:
        raise ValueError(f"part {index} of {count} (at most {MAX_PARTS} parts)")
    return name if count == 1 else f"{name}.part{index:03d}of{count:03d}"


def part_names(name: str, count: int) -> list[str]:
    return [part_name(name, i, count) for i in range(count)]


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    """An object as a replica plans over it: its stored parts, in order, and their bytes."""

    parts: tuple[str, ...]
    size: int


def fold(listing: Mapping[str, int]) -> dict[str, Stored]:
    """The bucket's `listing` (stored names and sizes) as whole objects: a name alone is
    itself, the parts of an object are that object once every one of them is there."""
    out = {name: Stored((name,), size) for name, size in listing.items() if not _PART.match(name)}
    for (name, count), parts in sorted(_part_sets(listing).items()):
        if len(parts) == count:  # complete; of two complete sets, the one in more parts
            ordered = tuple(part_names(name, count))
            out[name] = Stored(ordered, sum(listing[p] for p in ordered))
    return out


def _part_sets(listing: Mapping[str, int]) -> dict[tuple[str, int], set[str]]:
    """Stored parts by the object they belong to and their count (a trainer that restarted
    on another number of ranks writes other parts)."""
    sets: dict[tuple[str, int], set[str]] = {}
    for stored in listing:
        match = _PART.match(stored)
        if match is not None and int(match.group(2)) < int(match.group(3)):
            sets.setdefault((match.group(1), int(match.group(3))), set()).add(stored)
    return sets


def sizes(objects: Mapping[str, Stored]) -> dict[str, int]:
    return {name: stored.size for name, stored in objects.items()}


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
    listing: Mapping[str, int],
    live_versions: Iterable[int],
    keep_keyframes: int = 2,
) -> set[str]:
    """Stored names (`listing`: the bucket's names and sizes) the trainer may delete without
    costing any live replica a byte.

    Kept: the newest `keep_keyframes` keyframes (at least one) with their delta chains to the
    latest version (an older keyframe is the fallback when a newer one is refused), the plan of a
    new replica, and the plan of a replica at each live version. Since every kept plan survives,
    no replica's cheapest way to the latest version gets more expensive. An object goes with all
    of its parts; parts of an incomplete object below the latest version go too. Only names
    that parse are ever returned.
    """
    folded = fold(listing)
    doomed = _objects_to_delete(sizes(folded), live_versions, keep_keyframes)
    out = {part for name in doomed for part in folded[name].parts}
    latest = max((o.version for n in folded if (o := parse(n)) is not None), default=None)
    kept = {part for stored in folded.values() for part in stored.parts}
    for (name, _), parts in _part_sets(listing).items():
        obj = parse(name)
        if obj is not None and latest is not None and obj.version < latest:
            out |= parts - kept
    return out


def _objects_to_delete(
    objects: Mapping[str, int], live_versions: Iterable[int], keep_keyframes: int
) -> set[str]:
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
