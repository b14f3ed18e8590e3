"""An episode's samples held until it ends, so that groups rewarded alike can be left out.

For a policy with `trainer.uniformGroups: refill`, in async mode, the workflow runner does not
send its trainer the groups whose samples all got the same reward (all right, or all wrong):
their GRPO advantages are zero, so they would only take a place in its batch. The trainer's
batches then fill with groups it can learn from, and the runner generates more to make up for
the rest, which the staleness gate allows because the left-out samples never reach the trainer's
queue (DAPO's dynamic sampling). Which samples make up a group is only known once the workflow
has emitted them all, hence the hold: an episode's samples go out when it ends, or earlier
where its workflow says the groups emitted so far are whole (`Episode.settle`), and what an
episode cut short had not settled is not sent.

A policy that gets every problem right, or none (an untrained one), would have every group left
out and its trainer would wait forever; so at most `trainer.refillLimit` (default
`MOST_LEFT_OUT_IN_A_ROW`) of a policy's groups in a row are left out, and the next is sent
whatever its rewards (its trainer skips it: it trains on what there is, and its
`trained_fraction` says how much). Generation then costs at most limit + 1 times as much per
group sent, and such a trainer still takes its steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from polyrl.workers.workflows.sample import Sample

MOST_LEFT_OUT_IN_A_ROW = 5


@dataclass(frozen=True, slots=True)
class HeldSample:
    """The arguments of one `Episode.emit`, kept for later."""

    policy: str
    group: str
    sample: Sample
    index: int
    reward: float


class HeldGroups:
    """One episode's emissions by group (`add` has `Emit`'s signature), in order of emission."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], list[HeldSample]] = {}

    async def add(self, policy: str, group: str, sample: Sample, index: int, reward: float) -> None:
        held = HeldSample(policy, group, sample, index, reward)
        self.groups.setdefault((policy, group), []).append(held)

    def __iter__(self) -> Iterator[list[HeldSample]]:
        return iter(self.groups.values())

    def take(self) -> list[list[HeldSample]]:
        """The groups held so far, no longer held."""
        groups, self.groups = list(self.groups.values()), {}
        return groups


@dataclass
class LeaveOut:
    """Which groups of the `refill` policies to leave out, over all of a runner's episodes.
    `refill`: the policies that refill, or each one's limit (`trainer.refillLimit`)."""

    refill: AbstractSet[str] | Mapping[str, int]
    most_in_a_row: int = MOST_LEFT_OUT_IN_A_ROW
    in_a_row: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)  # samples
    left_out: Counter[str] = field(default_factory=Counter)  # samples

    def send(self, group: list[HeldSample]) -> bool:
        """Whether to send `group` (one policy's samples of one group); counts either way."""
        policy = group[0].policy
        if policy not in self.refill:
            return True
        uniform = len({s.reward for s in group}) == 1
        limit = self.refill[policy] if isinstance(self.refill, Mapping) else self.most_in_a_row
        if uniform and self.in_a_row[policy] < limit:
            self.in_a_row[policy] += 1
            self.left_out[policy] += len(group)
            return False
        self.in_a_row[policy] = 0
        self.sent[policy] += len(group)
        return True
