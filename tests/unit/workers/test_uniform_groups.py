"""`uniform_groups`: an episode's samples by group, and which groups of refilled policies are sent."""

from __future__ import annotations

from polyrl.workers.runner.uniform_groups import HeldGroups, HeldSample, LeaveOut
from polyrl.workers.workflows.sample import Sample

RESPONSE = Sample(prompt_tokens=[1], tokens=[], logprobs=[], loss_mask=None, weight_version=0)


def group(policy: str, *rewards: float, name: str = "e/g") -> list[HeldSample]:
    return [HeldSample(policy, name, RESPONSE, i, r) for i, r in enumerate(rewards)]


async def test_held_samples_come_back_by_group_in_order_of_first_emission() -> None:
    held = HeldGroups()
    emitted = [
        ("solver", "e/answer", 0, 1.0),
        ("verifier", "e/verdict-0", 0, 1.0),
        ("solver", "e/answer", 1, 0.0),
        ("verifier", "e/verdict-0", 1, 1.0),
        ("verifier", "e/answer", 0, 0.0),  # the same group name under another policy
    ]
    for policy, name, index, reward in emitted:
        await held.add(policy, name, RESPONSE, index, reward)
    assert [[(s.policy, s.group, s.index, s.reward) for s in g] for g in held] == [
        [emitted[0], emitted[2]],
        [emitted[1], emitted[3]],
        [emitted[4]],
    ]


def test_uniform_groups_of_a_refilled_policy_are_left_out_and_counted() -> None:
    leave = LeaveOut({"solver"})
    assert leave.send(group("solver", 1.0, 0.0, 1.0))
    assert not leave.send(group("solver", 1.0, 1.0, 1.0))
    assert leave.send(group("verifier", 1.0, 1.0))  # not refilled: always sent
    assert (leave.sent, leave.left_out) == ({"solver": 3}, {"solver": 3})


def test_a_policy_whose_groups_are_all_alike_still_gets_one_in_every_few() -> None:
    leave = LeaveOut({"solver"}, most_in_a_row=3)
    sent = [leave.send(group("solver", 0.0, 0.0)) for _ in range(8)]
    assert sent == [False, False, False, True, False, False, False, True]
    # A group that differs resets the count.
    leave = LeaveOut({"solver"}, most_in_a_row=3)
    sent = [leave.send(group("solver", *r)) for r in [(0, 0), (0, 0), (0, 1), (0, 0), (0, 0)]]
    assert sent == [False, False, True, False, False]


def test_each_policy_has_its_own_refill_limit_and_zero_leaves_nothing_out() -> None:
    leave = LeaveOut({"solver": 1, "verifier": 0})
    solver = [leave.send(group("solver", 0.0, 0.0)) for _ in range(4)]
    verifier = [leave.send(group("verifier", 1.0, 1.0)) for _ in range(2)]
    assert solver == [False, True, False, True]
    assert verifier == [True, True]
    assert leave.left_out == {"solver": 4}
