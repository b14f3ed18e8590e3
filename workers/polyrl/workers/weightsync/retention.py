"""Weight retention: the trainer prunes its weights bucket as it publishes.

Without pruning every version stays for the whole job: for a 7B model in bf16, a keyframe
every 20 versions is about 14 GB per 20 steps, and NATS's disk fills. After each publication
the trainer deletes what no replica needs (`chain.to_delete`): it keeps the newest two
keyframes with their delta chains to the latest version (the older one is the fallback when a
newer one is refused), and the cheapest path of every live replica, known from the rollout
workers' heartbeats. A replica that was away for longer than the kept chain catches up from
the newest keyframe, as a new one does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from polyrl.api.messages import Heartbeat
from polyrl.api.naming import JobNames
from polyrl.workers.weightsync.publish import WeightPublisher

log = logging.getLogger("polyrl.retention")
KEEP_KEYFRAMES = 2


async def live_versions(kv: KeyValue, policy: str) -> set[int]:
    """The weight versions `policy`'s rollout workers serve, from their heartbeats: its own
    pool's, and those of a shared pool that serves it (`rollout.servedBy`, whose heartbeats
    are filed under the serving policy and carry each policy's version in `pool`)."""
    marker = ".rollout."  # in every rollout heartbeat key, `<policy>.rollout.<pod>`
    try:
        keys = [k for k in await kv.keys() if marker in k]
    except NoKeysError:
        return set()
    versions: set[int] = set()
    for key in keys:
        entry = await kv.get(key)
        if not entry.value:
            continue
        try:
            beat = Heartbeat.model_validate_json(entry.value)
        except ValidationError:
            log.warning("malformed heartbeat under %s ignored", key)
            continue
        if beat.pool is not None and policy in beat.pool:
            versions.add(beat.pool[policy].weight_version)
        elif key.startswith(JobNames.heartbeat_key(policy, "rollout", "")):
            versions.add(beat.weight_version)
    return versions


async def prune(publisher: WeightPublisher, live: Iterable[int]) -> list[str]:
    """Delete what neither a live replica nor a new one needs; the names deleted."""
    deleted = await publisher.prune(live, keep_keyframes=KEEP_KEYFRAMES)
    if deleted:
        log.debug("pruned %s", ", ".join(deleted))
    return deleted
