"""Frozen policies (`frozen: true`): served, never trained. What the API server and the spec
model refuse, said once.

A frozen policy is a judge, a reward model, a teacher or a fixed opponent: its PolicyGroup
runs rollout replicas and a publisher (which puts the model bundle and version 0 into the
policy's Object Store bucket once), no trainer. So nothing of the trainer applies to it: no
warm-up, no evaluation, no adapters; and a job must train at least one policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from polyrl.api.resources import PolicySpec, RLJobSpec

POLICY_MESSAGE = (
    "a frozen policy is never trained: it takes no trainer.lora, trainer.warmupSteps, "
    "trainer.evalEvery or trainer.steps"
)
POLICY_RULE = (
    "!has(self.frozen) || !self.frozen || !has(self.trainer) || "
    "(!has(self.trainer.lora) && !has(self.trainer.steps) && "
    "(!has(self.trainer.warmupSteps) || self.trainer.warmupSteps == 0) && "
    "(!has(self.trainer.evalEvery) || self.trainer.evalEvery == 0))"
)
JOB_MESSAGE = "every policy is frozen: a job trains at least one policy"
JOB_RULE = "self.policies.exists(p, !has(p.frozen) || !p.frozen)"
SYNC_MESSAGE = (
    "frozen policies need algorithm.mode async: sync mode's rounds wait for every policy's trainer"
)
SYNC_RULE = "self.algorithm.mode != 'sync' || self.policies.all(p, !has(p.frozen) || !p.frozen)"


def policy_problems(policy: PolicySpec) -> str | None:
    """Why `policy` cannot be frozen as written (the API server's POLICY_RULE), or None."""
    trainer = policy.trainer
    if not policy.frozen:
        return None
    if trainer.lora is not None or trainer.steps is not None:
        return POLICY_MESSAGE
    if trainer.warmup_steps or trainer.eval_every:
        return POLICY_MESSAGE
    return None


def job_problems(spec: RLJobSpec) -> str | None:
    """Why the job's frozen policies cannot run as written (JOB_RULE, SYNC_RULE), or None."""
    if all(p.frozen for p in spec.policies):
        return JOB_MESSAGE
    if spec.algorithm.mode == "sync" and any(p.frozen for p in spec.policies):
        return SYNC_MESSAGE
    return None
