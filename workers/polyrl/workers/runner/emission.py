"""What leaves the workflow runner: trajectories for the trainers, and its account of them.

An episode's scored samples go out as Trajectories on their policy's stream, each under a
deterministic id, so a publish retried through an outage is stored once (`Emission.emit`);
their acknowledgements are awaited in a bounded window, not one by one (`runtime.window`). A
policy that refills its batches (`trainer.uniformGroups: refill`) gets its samples only once
their groups are whole, and not those rewarded alike (`uniform_groups`): its episodes' samples
are held until then (`Emission.hold`). What the episodes came to, the samples and prompts
dropped, the episodes failed, the rewards, is counted beside (`Accounts`): on the runner's
heartbeat, where the operator and `polyrl run` read it, and in the run's metrics; and a reward
that fails on every sample stops the runner (`reward_health`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from polyrl.api.resources import Mode, UniformGroups
from polyrl.api.wire import Trajectory
from polyrl.workers.runner import reward_health, rounds, uniform_groups
from polyrl.workers.runtime import outage, window
from polyrl.workers.runtime.worker import MetricsLog, Runtime
from polyrl.workers.workflows.episode import Emit, Episode, Settle, nothing_held
from polyrl.workers.workflows.interface import Reports, Workflow
from polyrl.workers.workflows.sample import Sample

log = logging.getLogger("polyrl.workflow")


class Emission:
    """Sends trajectories; holds a refilling policy's until their groups are whole."""

    def __init__(self, rt: Runtime, *, on_error: Callable[[Exception], None] | None = None) -> None:
        self.rt = rt
        # Policies whose uniform groups are not sent (`uniform_groups`). Sync mode's rounds need
        # their batches from a fixed number of episodes: there the trainers leave them out instead.
        spec = rt.config.spec
        refill = {
            p.name: p.trainer.refill_limit
            for p in spec.policies
            if spec.algorithm.mode != Mode.SYNC and p.trainer.uniform_groups == UniformGroups.REFILL
        }
        self.leave_out = uniform_groups.LeaveOut(refill)
        self.window = window.PublishWindow(on_error=on_error)  # a trajectory lost for good

    def hold(self) -> uniform_groups.HeldGroups | None:
        """Where one episode's samples wait (None: no policy refills, each goes out at once)."""
        return uniform_groups.HeldGroups() if self.leave_out.refill else None

    def verbs(self, held: uniform_groups.HeldGroups | None) -> tuple[Emit, Settle]:
        """The episode's `emit` and `settle`: straight out, or into `held` until settled."""
        if held is None:
            return self.emit, nothing_held
        return held.add, functools.partial(self.release, held)

    async def release(self, held: uniform_groups.HeldGroups) -> None:
        """Send the samples held so far, but the groups `leave_out` leaves out (at the end of
        an episode, or where its workflow settles them: `Episode.settle`)."""
        for group in held.take():
            if self.leave_out.send(group):
                for s in group:
                    await self.emit(s.policy, s.group, s.sample, s.index, s.reward)

    async def emit(
        self, policy: str, group: str, sample: Sample, index: int, reward: float
    ) -> None:
        trajectory = Trajectory(
            id=f"{group}/{index}",
            episode_id=group.split("/", 1)[0],
            group_id=group,
            policy=policy,
            prompt_tokens=sample.prompt_tokens,
            tokens=sample.tokens,
            logprobs=sample.logprobs,
            loss_mask=sample.loss_mask,
            reward=reward,
            weight_version=sample.weight_version,
            created_at=time.time(),
            finish_reason=sample.finish_reason,
        )
        subject = self.rt.names.trajectories_subject(policy)
        body = trajectory.model_dump_json().encode()
        await self.window.submit(
            lambda: outage.retry(  # stored once: the message id
                lambda: self.rt.js.publish(subject, body, headers={"Nats-Msg-Id": trajectory.id}),
                what=f"trajectory {trajectory.id}",
            )
        )

    async def flush(self) -> None:
        """Every trajectory emitted so far acknowledged (before the runner stops)."""
        await self.window.flush()

    def log_left_out(self) -> None:
        for policy, count in sorted(self.leave_out.left_out.items()):
            log.info(
                "%s: left out %d samples of groups rewarded alike, sent %d",
                policy,
                count,
                self.leave_out.sent[policy],
            )


class Accounts:
    """The runner's counts and figures; `stop` is told when the rewards keep failing."""

    def __init__(
        self, rt: Runtime, gate: rounds.RoundGate | None, stop: Callable[[Exception], None]
    ) -> None:
        self.rt, self.gate, self.stop = rt, gate, stop
        self.episodes = 0
        self.failed = 0
        self.dropped_prompts = 0  # episodes whose prompt a policy could not take
        self.dropped_by_reason: Counter[tuple[str, str]] = Counter()  # by policy and reason
        self.judge_fallbacks: dict[str, int] = {}  # failed verdicts given the fallback score
        self.dropped_samples = 0  # samples whose reward failed (`Episode.drop`)
        self.reward_health = reward_health.RewardHealth()
        self.recent: dict[str, list[float]] = {}
        self.metrics = MetricsLog.from_env()
        self.started = time.monotonic()

    def prompt_dropped(self, episode: Episode, err: Exception) -> None:
        """An episode a policy could not take the prompt of: too long, refused, or a
        conversation past its limits (`ConversationTooLong`'s reason: turns, context)."""
        self.dropped_prompts += 1
        reason = getattr(err, "reason", "prompt")
        self.dropped_by_reason[getattr(err, "policy", None) or "-", reason] += 1
        log.warning("episode %s dropped (%s): %s", episode.id, reason, err)
        self._figures()

    def episode_failed(self, episode: Episode, err: Exception) -> None:
        self.failed += 1
        log.warning("episode %s failed: %s", episode.id, err)

    def episode_done(self, episode: Episode, workflow: Workflow) -> None:
        self.episodes += 1
        for reason in episode.dropped:
            log.warning("sample dropped: %s", reason)
        self.dropped_samples += len(episode.dropped)
        for policy, count in episode.judge_fallbacks.items():
            self.judge_fallbacks[policy] = self.judge_fallbacks.get(policy, 0) + count
        scored = sum(len(rewards) for rewards in episode.rewards.values())
        self.reward_health.record(scored=scored, dropped=episode.dropped)
        try:
            self.reward_health.check()
        except reward_health.RewardsFailing as err:
            self.stop(err)
        if isinstance(workflow, Reports):
            self.write_metrics(workflow.report())
        for policy, rewards in episode.rewards.items():
            window = self.recent.setdefault(policy, [])
            window.extend(rewards)
            del window[:-512]
        self._figures()

    def _figures(self) -> None:
        means = [sum(w) / len(w) for w in self.recent.values() if w]
        self.rt.figures = {
            "requests_served": self.episodes,
            "dropped_prompts": self.dropped_prompts,
            "dropped_samples": self.dropped_samples,
            "failed_episodes": self.failed,
            "dropped_episodes": self.dropped_episodes(),
            "judge_fallbacks": dict(sorted(self.judge_fallbacks.items())) or None,
            "reward": sum(means) / len(means) if means else None,
        }
        elapsed = time.monotonic() - self.started
        if self.gate is not None and elapsed > 0:
            self.rt.figures["idle_fraction"] = min(1.0, self.gate.waited / elapsed)

    def dropped_episodes(self) -> dict[str, dict[str, int]]:
        """Episodes dropped whole, by policy and reason (the heartbeat's `dropped_episodes`)."""
        out: dict[str, dict[str, int]] = {}
        for (policy, reason), count in sorted(self.dropped_by_reason.items()):
            out.setdefault(policy, {})[reason] = count
        return out

    def write_metrics(self, records: list[dict[str, Any]]) -> None:
        """The workflow's own figures (a verifier's judging) into the run's metrics, beside
        the trainers' lines, and the log."""
        for record in records:
            log.info("judged %s", record)
        self.metrics.write(records)

    def log_stopped(self, cut_short: int, waited: float) -> None:
        by_reason: Counter[str] = Counter()
        for (_, reason), count in self.dropped_by_reason.items():
            by_reason[reason] += count
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(by_reason.items()))
        if self.judge_fallbacks:
            log.info(
                "judge verdicts that failed and got the fallback score: %s", self.judge_fallbacks
            )
        log.info(
            "stopped: %d episodes done, %d failed, %d dropped (%s), %d cut short; requests "
            "waited %.0f s in all for trainers to catch up",
            self.episodes,
            self.failed,
            self.dropped_prompts,
            reasons or "none",
            cut_short,
            waited,
        )
