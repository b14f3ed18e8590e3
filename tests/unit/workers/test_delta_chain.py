"""Planning a replica's way to the latest weights, and retention that never strands a live one."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyrl.workers.weightsync import chain
from polyrl.workers.weightsync.chain import NoPath, delta_name, keyframe_name, plan_sync, to_delete

KEY, DELTA = 1000, 10  # a keyframe costs as much as a hundred deltas


def published(latest: int, every: int, key: int = KEY, delta: int = DELTA) -> dict[str, int]:
    """What a trainer leaves in the bucket after publishing versions 0..latest."""
    objects = {keyframe_name(v): key for v in range(0, latest + 1, every)}
    return objects | {delta_name(v - 1, v): delta for v in range(1, latest + 1)}


def walk(have: int | None, plan: list[str]) -> int | None:
    """The version reached by applying `plan` from `have`; fails on a delta of another base."""
    for name in plan:
        obj = chain.parse(name)
        assert obj is not None, name
        assert obj.is_keyframe or obj.base == have, f"{name} applied at version {have}"
        have = obj.version
    return have


def cost(have: int | None, latest: int, objects: Mapping[str, int]) -> int | None:
    try:
        return sum(objects[name] for name in plan_sync(have, latest, objects))
    except NoPath:
        return None


def test_names_sort_by_version_and_parse_back() -> None:
    assert delta_name(11, 12) == "v000000000012.delta.from000000000011"
    assert keyframe_name(10) == "v000000000010.key"
    assert sorted([keyframe_name(10), delta_name(9, 10), delta_name(99, 100)])[-1].startswith(
        "v000000000100"
    )
    assert chain.parse(delta_name(11, 12), 5) == chain.WeightObject(delta_name(11, 12), 12, 11, 5)
    assert chain.parse("v12.key") is None
    assert chain.parse("notes.txt") is None
    with pytest.raises(ValueError, match="forward"):
        delta_name(12, 12)


def test_a_replica_one_behind_applies_one_delta() -> None:
    assert plan_sync(19, 20, published(20, 5)) == [delta_name(19, 20)]


def test_a_new_replica_starts_from_the_latest_keyframe() -> None:
    assert plan_sync(None, 22, published(22, 5)) == [
        keyframe_name(20),
        delta_name(20, 21),
        delta_name(21, 22),
    ]


def test_a_replica_far_behind_jumps_to_the_keyframe_when_the_chain_costs_more() -> None:
    objects = published(300, 100)
    assert plan_sync(2, 300, objects) == [keyframe_name(300)]  # 298 deltas: 2980 > 1000
    assert walk(250, plan_sync(250, 300, objects)) == 300
    assert len(plan_sync(250, 300, objects)) == 50  # 50 deltas: 500 < 1000


def test_refused_objects_are_planned_around() -> None:
    objects = published(12, 5)
    plan = plan_sync(7, 12, objects, avoid=[delta_name(8, 9)])
    assert plan == [keyframe_name(10), delta_name(10, 11), delta_name(11, 12)]
    with pytest.raises(NoPath):
        plan_sync(7, 12, objects, avoid=[delta_name(11, 12)])


def test_a_replica_ahead_of_latest_starts_over_from_a_keyframe() -> None:
    assert plan_sync(30, 12, published(12, 5))[0] == keyframe_name(10)


@st.composite
def buckets(draw: st.DrawFn) -> tuple[dict[str, int], int]:
    """A bucket after retention and losses: any subset of deltas and keyframes, any sizes."""
    latest = draw(st.integers(0, 40))
    objects: dict[str, int] = {}
    for version in range(latest + 1):
        if draw(st.booleans()) or version == latest:
            objects[keyframe_name(version)] = draw(st.integers(1, 2000))
        if version > 0:
            for base in draw(st.sets(st.integers(max(0, version - 3), version - 1), max_size=2)):
                objects[delta_name(base, version)] = draw(st.integers(1, 300))
    for name in draw(st.sets(st.sampled_from(sorted(objects)), max_size=len(objects) // 2)):
        if name != keyframe_name(latest) or draw(st.booleans()):
            objects.pop(name)
    return objects, latest


@pytest.mark.slow  # 300 examples: 10-20 s on a busy 2-core machine
@settings(max_examples=300, deadline=None)
@given(buckets(), st.one_of(st.none(), st.integers(0, 45)))
def test_a_plan_always_reaches_latest_by_a_valid_chain_and_beats_both_simple_ways(
    bucket: tuple[dict[str, int], int], have: int | None
) -> None:
    objects, latest = bucket
    try:
        plan = plan_sync(have, latest, objects)
    except NoPath:
        # Then neither the chain from `have` nor any keyframe with its chain gets there.
        assert have is None or have > latest or _chain_cost(have, latest, objects) is None
        assert all(
            _chain_cost(v, latest, objects) is None
            for v in range(latest + 1)
            if keyframe_name(v) in objects
        )
        return
    assert walk(have if have is None or have <= latest else None, plan) == latest
    total = sum(objects[name] for name in plan)
    if have is not None and have <= latest and (alone := _chain_cost(have, latest, objects)):
        assert total <= alone
    for v in range(latest + 1):
        if keyframe_name(v) in objects and (after := _chain_cost(v, latest, objects)) is not None:
            assert total <= objects[keyframe_name(v)] + after


def _chain_cost(have: int, latest: int, objects: Mapping[str, int]) -> int | None:
    """Cheapest pure delta chain, by memoised recursion from `have` (not the sweep under test)."""
    edges: dict[int, list[tuple[int, int]]] = {}
    for name, size in objects.items():
        obj = chain.parse(name, size)
        if obj is not None and obj.base is not None and obj.version <= latest:
            edges.setdefault(obj.base, []).append((obj.version, size))

    @functools.cache
    def rest(version: int) -> int | None:
        if version == latest:
            return 0
        costs = [size + r for new, size in edges.get(version, []) if (r := rest(new)) is not None]
        return min(costs, default=None)

    return rest(have)


@pytest.mark.slow  # 300 examples: 10-20 s on a busy 2-core machine
@settings(max_examples=300, deadline=None)
@given(
    buckets(),
    st.sets(st.integers(0, 45), max_size=6),
    st.integers(0, 4),
    st.dictionaries(st.sampled_from(["notes.txt", "v1.key", "other"]), st.integers(0, 9)),
)
def test_retention_never_deletes_what_a_live_or_new_replica_needs(
    bucket: tuple[dict[str, int], int],
    live: set[int],
    keep_keyframes: int,
    foreign: dict[str, int],
) -> None:
    ours, _ = bucket
    objects = {**ours, **foreign}
    doomed = to_delete(objects, live, keep_keyframes)
    remaining = {name: size for name, size in objects.items() if name not in doomed}
    assert doomed <= set(ours)
    if not ours:
        return
    latest = max(obj.version for name in ours if (obj := chain.parse(name)) is not None)
    for have in {None, *live}:
        before = cost(have, latest, objects)
        assert cost(have, latest, remaining) == before
        if before is not None:
            start = None if have is None or have > latest else have
            assert walk(start, plan_sync(have, latest, remaining)) == latest
    kept = sorted(v for v in range(latest + 1) if keyframe_name(v) in remaining)
    all_keys = [v for v in range(latest + 1) if keyframe_name(v) in objects]
    assert kept[-max(1, keep_keyframes) :] == all_keys[-max(1, keep_keyframes) :]


def test_retention_of_a_steady_bucket_keeps_two_keyframes_and_what_replicas_use() -> None:
    objects = published(23, 5)
    doomed = to_delete(objects, live_versions={22, 17}, keep_keyframes=2)
    remaining = set(objects) - doomed
    assert {keyframe_name(20), keyframe_name(15)} <= remaining
    assert keyframe_name(10) in doomed
    assert delta_name(3, 4) in doomed
    assert {delta_name(v - 1, v) for v in range(16, 24)} <= remaining  # chain from 15 and 17


def in_parts(objects: Mapping[str, int], count: int) -> dict[str, int]:
    """The bucket of a trainer sharded over `count` ranks: each object in `count` parts."""
    return {
        chain.part_name(name, i, count): size // count
        for name, size in objects.items()
        for i in range(count)
    }


def test_parts_are_named_after_their_object_and_a_single_part_is_the_object_itself() -> None:
    name = delta_name(11, 12)
    assert chain.part_names(name, 2) == [f"{name}.part000of002", f"{name}.part001of002"]
    assert chain.part_names(name, 1) == [name]
    assert chain.parse(chain.part_name(name, 0, 2)) is None  # a part is never planned alone
    with pytest.raises(ValueError, match="part 2 of 2"):
        chain.part_name(name, 2, 2)


def test_objects_in_parts_are_planned_as_one_once_every_part_is_there() -> None:
    listing = in_parts(published(12, 5), 3)
    folded = chain.fold(listing)
    assert folded[keyframe_name(10)].parts == tuple(chain.part_names(keyframe_name(10), 3))
    assert folded[keyframe_name(10)].size == 3 * (KEY // 3)
    assert plan_sync(None, 12, chain.sizes(folded)) == [
        keyframe_name(10),
        delta_name(10, 11),
        delta_name(11, 12),
    ]
    del listing[chain.part_name(delta_name(11, 12), 1, 3)]  # a trainer stopped mid-write
    assert delta_name(11, 12) not in chain.fold(listing)
    with pytest.raises(NoPath):
        plan_sync(11, 12, chain.sizes(chain.fold(listing)))


def test_retention_deletes_an_objects_parts_together_and_an_incomplete_sets_when_passed() -> None:
    listing = in_parts(published(22, 5), 2)
    whole = to_delete(published(22, 5), live_versions={21})
    doomed = to_delete(listing, live_versions={21})
    assert doomed == {part for name in whole for part in chain.part_names(name, 2)}
    # Parts of a version whose other parts never came: kept while it is the latest (its
    # writer may still be at it), deleted once a later version is complete.
    torn = chain.part_name(delta_name(22, 23), 0, 2)
    assert torn not in to_delete(listing | {torn: 5}, live_versions={21})
    later = listing | {torn: 5, keyframe_name(24): KEY}
    assert torn in to_delete(later, live_versions={21})
    # A restart on another number of ranks writes other parts of the same names.
    other = in_parts({keyframe_name(25): KEY}, 1) | in_parts({keyframe_name(25): KEY}, 3)
    assert chain.fold(other)[keyframe_name(25)].parts == tuple(
        chain.part_names(keyframe_name(25), 3)
    )
