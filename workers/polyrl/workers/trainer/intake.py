"""The trainer's intake: a batch of fresh trajectories off its stream, stale ones dropped.

Shared by the trainer's loop (`loop`) and the benchmarks' trainers that replace its math
(`simulated`, `polyrl bench dataplane`'s null trainer), so what they measure is the real
intake. Nothing here needs torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from nats.aio.msg import Msg
from pydantic import ValidationError

from polyrl.api.wire import Trajectory
from polyrl.workers.runtime import outage
from polyrl.workers.runtime.worker import Runtime


class Versioned(Protocol):
    """Anything stamped with the weight version of the policy that generated it."""

    @property
    def weight_version(self) -> int: ...


V = TypeVar("V", bound=Versioned)


def filter_stale(
    samples: Iterable[V], *, current_version: int, max_staleness: int
) -> tuple[list[V], int]:
    """Keep samples at most `max_staleness` weight versions behind; return (kept, dropped count).

    Truncated importance sampling corrects moderate policy lag, but the further the behaviour
    policy is from the current one the more weights hit the cap and the noisier (and more
    biased) the gradient gets; bounding the age keeps asynchronous training close to on-policy.
    ``max_staleness=0`` is fully on-policy. A sample from a version newer than the trainer's
    (which should not happen) has age <= 0 and is kept. Order is preserved.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    kept: list[V] = []
    dropped = 0
    for sample in samples:
        if current_version - sample.weight_version <= max_staleness:
            kept.append(sample)
        else:
            dropped += 1
    return kept, dropped


async def pull_batch(
    rt: Runtime, sub: Any, want: int, *, version: int, max_staleness: int
) -> tuple[list[Trajectory], list[Msg], list[str]]:
    """`want` fresh trajectories with their messages (ack later), and the stale ones' ids."""
    kept: list[Trajectory] = []
    msgs: list[Msg] = []
    dropped: list[str] = []
    while len(kept) < want and not rt.stopping.is_set():
        try:
            got = await sub.fetch(want - len(kept), timeout=1.0)
        except TimeoutError:
            continue  # nothing yet
        except outage.TRANSIENT:  # NATS restarting: JetStream answers 503 until it is back
            await asyncio.sleep(0.25)
            continue
        for msg in got:
            try:
                trajectory = Trajectory.model_validate_json(msg.data)
            except ValidationError as err:
                await rt.dead_letter(msg.subject, msg.data, f"malformed trajectory: {err}")
                await msg.term()
                continue
            fresh, stale = filter_stale(
                [trajectory], current_version=version, max_staleness=max_staleness
            )
            if stale:
                dropped.append(trajectory.id)
                await msg.ack()
            else:
                kept.extend(fresh)
                msgs.append(msg)
    return kept, msgs, dropped
