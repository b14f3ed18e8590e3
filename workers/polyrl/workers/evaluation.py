"""What a trainer does besides GRPO steps: the warm start before RL and held-out evaluation.

Both concern only the workflow's policies in their roles: the first policy is warmed up on
the task's answers and scored by greedy accuracy on the task's fixed held-out split; the
second policy of a solver-verifier job is warmed up on worked verdicts and scored by balanced
accuracy on right and near-miss answers (`tasks.verify.VerificationTask`) and on an exam of the
warm-started solver's own answers (`solver_answers`, `exam_cases`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from polyrl.workers import tasks, warmup
from polyrl.workers.tasks import base, verify

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from polyrl.workers.trainer import Trainer

WARMUP_LR = 3e-3  # measured on the tiny model: 150 steps take 1-digit addition from 0 to ~0.9
# Decoupled weight decay (AdamW) shortens the plateau before a tiny model's accuracy takes off,
# as it does for grokking. Measured on `quickstart-solver`, 2-digit addition, batch 32, to the
# quick start's 40 % target: 1,650 / 1,130 steps at 0.1 against 2,420 / 1,830 without (two data
# orders); reversed answers, batch 128, to 20 %: 670 steps, where without it 1,500 were not enough.
WARMUP_WEIGHT_DECAY = 0.1
EVAL_PROBLEMS = 1000
VERIFIER_EVAL_PROBLEMS = 500  # each shown right and wrong: 1,000 verdicts
WARMUP_DEV_PROBLEMS = 200  # from the training distribution: the held-out split stays unseen
# A verifier's warm-up may measure its target on the warm-started solver's own answers to
# problems of the training distribution instead (`verifier_dev`): this many right and as many
# wrong, picked from the solver's answers to SOLVER_DEV_PROBLEMS, enough for both sides from a
# solver between about 15 and 85 % right; none with fewer than MIN_DEV_PER_SIDE on a side.
VERIFIER_DEV_PER_SIDE = 100
SOLVER_DEV_PROBLEMS = 800
MIN_DEV_PER_SIDE = 25


def warm_start(
    trainer: Trainer, spec: Any, *, dev: Sequence[base.Problem] = ()
) -> dict[str, float]:
    """Supervised warm-up before version 0, once: the workflow's first policy on the task's
    answers, and a solver-verifier job's verifier on verdicts of right and near-miss answers.

    The warm-up stops at its target accuracy on `dev`, by default on problems drawn like its
    training ones (for the verifier: right answers and synthetic near misses). Its trainer
    uses the default; `scripts/grpo_verifier.py --solver-dev` gives a verifier its solver's
    own answers (`verifier_dev`), on which, unlike on near misses, the exam then starts where
    the target says (docs/benchmarks.md, session 10).
    """
    steps = trainer.policy.trainer.warmup_steps
    task = warmup_task(trainer.policy.name, spec)
    if task is None or steps == 0 or trainer.state.step > 0 or trainer.state.epoch > 0:
        return {}
    checked = list(dev) or dev_problems(task, spec, WARMUP_DEV_PROBLEMS)
    warmed = warmup.supervised_warmup(
        trainer.model,
        trainer.tokenizer,
        task,
        steps=steps,
        batch_size=trainer.policy.trainer.warmup_batch_size,
        lr=WARMUP_LR,
        weight_decay=WARMUP_WEIGHT_DECAY,
        seed=spec.workflow.task.seed,
        target=trainer.policy.trainer.warmup_target_accuracy,
        dev=checked,
        max_new_tokens=room(trainer.policy.name, spec),
    )
    return {**warmed, "dev_problems": float(len(checked)), "dev_from_solver": float(bool(dev))}


def dev_problems(task: Any, spec: Any, count: int) -> list[base.Problem]:
    """`count` problems of `task`'s training distribution, the same for every trainer of the
    job (drawn from the task's seed + 1), on which warm-ups measure their targets."""
    rng = random.Random(spec.workflow.task.seed + 1)
    return [task.sample(rng) for _ in range(count)]


def solver_dev_answers(model: PreTrainedModel, tokenizer: Any, spec: Any) -> list[str]:
    """The solver's greedy answers to `SOLVER_DEV_PROBLEMS` problems of the training
    distribution, which the verifier's warm-up is measured on (`verifier_dev`)."""
    problems = dev_problems(tasks.load_task(spec.workflow.task), spec, SOLVER_DEV_PROBLEMS)
    return greedy_answers(model, tokenizer, problems, spec)


def verifier_dev(answers: Sequence[str], spec: Any) -> list[base.Problem]:
    """A verifier's warm-up dev cases from the solver's `answers` (`solver_dev_answers`): the
    first `VERIFIER_DEV_PER_SIDE` right ones and as many wrong ones, so that accuracy on them
    is balanced accuracy, as on the exam. Empty if either side has fewer than
    `MIN_DEV_PER_SIDE` (a solver nearly always right or nearly always wrong)."""
    task = tasks.load_task(spec.workflow.task)
    cases = candidates(task, dev_problems(task, spec, len(answers)), answers)
    right = [c for c in cases if verify.truth(c)]
    wrong = [c for c in cases if not verify.truth(c)]
    per_side = min(VERIFIER_DEV_PER_SIDE, len(right), len(wrong))
    return right[:per_side] + wrong[:per_side] if per_side >= MIN_DEV_PER_SIDE else []


def is_verifier(policy: str, spec: Any) -> bool:
    """Whether `policy` is the verifier: a solver-verifier workflow's second policy."""
    return bool(spec.workflow.name == "solver-verifier" and policy == spec.policies[1].name)


def room(policy: str, spec: Any) -> int:
    """`policy`'s generation budget: an answer's, plus the verdict for a verifier."""
    tokens = int(spec.algorithm.max_new_tokens)
    return verify.verifier_max_new_tokens(tokens) if is_verifier(policy, spec) else tokens


def warmup_task(policy: str, spec: Any) -> Any:
    """What `policy` is warmed up on, or None if the workflow gives it nothing to learn from."""
    task = tasks.load_task(spec.workflow.task)
    if policy == spec.policies[0].name:
        return task
    if is_verifier(policy, spec):
        return verify.VerificationTask(task)
    return None


def prefixed(warmed: dict[str, float]) -> dict[str, float]:
    return {f"warmup_{k}": v for k, v in warmed.items()}


def has_exam(spec: Any) -> bool:
    """Whether the job's verifier sits an exam on its solver's answers (`solver_answers`)."""
    return bool(spec.workflow.name == "solver-verifier" and len(spec.policies) > 1)


def solver_answers(model: PreTrainedModel, tokenizer: Any, spec: Any) -> list[str]:
    """The solver's greedy answers to the held-out problems of the verifier's exam.

    Taken from the warm-started solver (its trainer publishes them at step 0: `exam`), they
    make the verifier's fixed exam (`exam_cases`): the solver's own kind of mistakes, on which
    RL trains the verifier (the held-out near misses are synthetic), and unlike the answers the
    workflow runner sees judged during RL (`judging`), they do not change as the solver
    learns, so a rise in the verifier's figure on them is the judge's own.
    """
    problems = tasks.load_task(spec.workflow.task).held_out()[:VERIFIER_EVAL_PROBLEMS]
    return greedy_answers(model, tokenizer, problems, spec)


def greedy_answers(
    model: PreTrainedModel, tokenizer: Any, problems: Sequence[base.Problem], spec: Any
) -> list[str]:
    """A solver's greedy answers to `problems`, in the job's answer room."""
    prompts = [p.prompt for p in problems]
    return warmup.greedy_completions(model, tokenizer, prompts, spec.algorithm.max_new_tokens)


def exam_cases(answers: Sequence[str], spec: Any) -> list[base.Problem]:
    """The held-out problems with `answers` as candidates, each right or wrong by the task."""
    task = tasks.load_task(spec.workflow.task)
    return candidates(task, task.held_out()[:VERIFIER_EVAL_PROBLEMS], answers)


def candidates(
    task: Any, problems: Sequence[base.Problem], answers: Sequence[str]
) -> list[base.Problem]:
    """`problems` with `answers` as candidates for a verifier to judge, as many as both have,
    each right or wrong by `task`'s check (`VerificationTask.case`)."""
    judge = verify.VerificationTask(task)
    return [judge.case(p, answer) for p, answer in zip(problems, answers, strict=False)]


def evaluate(trainer: Trainer, spec: Any, *, exam: Sequence[base.Problem] = ()) -> dict[str, float]:
    """Held-out figures every `evalEvery` steps: the solver's greedy accuracy, the verifier's
    balanced accuracy (for the solver-verifier workflow's second policy) on near misses and,
    given the `exam` of `solver_answers`, on the solver's answers."""
    every = trainer.policy.trainer.eval_every
    if every == 0 or trainer.state.step % every:
        return {}
    task = tasks.load_task(spec.workflow.task)
    held_out = task.held_out()[:EVAL_PROBLEMS]
    torch.nn.Module.eval(trainer.model)
    if trainer.policy.name == spec.policies[0].name:
        accuracy = warmup.greedy_accuracy(
            trainer.model,
            trainer.tokenizer,
            held_out,
            max_new_tokens=spec.algorithm.max_new_tokens,
            reward=task.reward,
        )
        return {"accuracy": accuracy}
    if is_verifier(trainer.policy.name, spec):
        balanced = warmup.verifier_balanced_accuracy(
            trainer.model,
            trainer.tokenizer,
            task,
            held_out[:VERIFIER_EVAL_PROBLEMS],
            max_new_tokens=room(trainer.policy.name, spec),
        )
        if not exam:
            return {"balanced_accuracy": balanced}
        on_answers = warmup.balanced_verdict_accuracy(
            trainer.model,
            trainer.tokenizer,
            verify.VerificationTask(task),
            exam,
            max_new_tokens=room(trainer.policy.name, spec),
        )
        return {"balanced_accuracy": balanced, "answers_balanced_accuracy": on_answers}
    return {}
