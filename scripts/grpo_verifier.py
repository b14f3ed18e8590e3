"""The quick start's verifier trained with GRPO in one process: a fast loop for its RL.

A full `polyrl run` takes 5-9 minutes and tells one verifier figure; this loop takes 2-7
and shows how its exam moves. It warms the quick start's solver and verifier up exactly as
their trainers do (`evaluation.warm_start`, cached under --cache), builds the same exam (the
warm-started solver's greedy answers to 500 held-out problems, `evaluation.exam_cases`: the
same figure at step 0 as the pipeline's on the same machine), then trains the verifier with
the trainer's own step (`Trainer.step`, the quick start's verifier settings) on the
solver-verifier workflow's episodes: 16 problems a step, 8 solver samples each, one right and
one wrong answer judged (`balanced_pick`) by 8 verifier samples. The answers come from fixed
solvers, not a learning one: the warm-started solver and, with --late (e.g. a pipeline run's
trainers/.../solver/checkpoint/model.safetensors), a trained one for --late-share of the
problems, so the verifier's gains are its own. Prints JSON lines: the exam, the reward and the
verdicts' hit rate on training episodes; and, before and after, what kind of mistakes the
verifier makes on the exam (`breakdown`).

    .venv/bin/python scripts/grpo_verifier.py --late runs/qs/trainers/local/quickstart/solver/checkpoint/model.safetensors
    .venv/bin/python scripts/grpo_verifier.py --late ... --reward both --temperature 1.0 --lr 5e-4

--task-seed, --verifier-target and --solver-dev change what the warm starts are made from (the
task's seed also picks the held-out split, and so the exam); the cache keeps one warm start
per setting. --solver-dev stops the verifier's warm-up at its target balanced accuracy on the
warm-started solver's own answers to training problems instead of on synthetic near misses
(docs/benchmarks.md, session 10).

--reward: `verdict` (the workflow's: 1 for a verdict that agrees with the truth), `working`
(1 for working equal to the answer), `both` (half each), `gate` (the verdict's, halved when the
working is wrong). One thread; about 1 s a step alone on this machine.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / d) for d in ("operator", "workers")]

from polyrl.local import jobfile  # noqa: E402
from polyrl.workers import batching, checkpoint, evaluation, tasks, warmup  # noqa: E402
from polyrl.workers.engines.base import SamplingParams  # noqa: E402
from polyrl.workers.engines.torch_engine import TorchEngine  # noqa: E402
from polyrl.workers.tasks import base, verify  # noqa: E402
from polyrl.workers.trainer import Trainer  # noqa: E402
from polyrl.workers.workflows.builtin import balanced_pick  # noqa: E402

PROBLEMS, GROUP = 16, 8  # per step: 16 episodes, 2 answers judged 8 times each: 256 samples


def parse() -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--job", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    cli.add_argument(
        "--cache", type=Path, default=Path("/tmp/polyrl-grpo-verifier"), help="warm starts"
    )
    cli.add_argument("--reward", default="verdict", choices=["verdict", "working", "both", "gate"])
    cli.add_argument("--lr", type=float, help="default: the job's verifier lr")
    cli.add_argument("--updates", type=int, help="default: the job's updatesPerBatch")
    cli.add_argument("--temperature", type=float, help="verifier sampling; default: the job's")
    cli.add_argument("--steps", type=int, default=150)
    cli.add_argument("--late", type=Path, help="a trained solver's weights, mixed in")
    cli.add_argument("--late-share", type=float, default=0.5)
    cli.add_argument("--every", type=int, default=25, help="steps between exams")
    cli.add_argument("--seed", type=int, default=0, help="sampling and episodes")
    cli.add_argument(
        "--task-seed", type=int, help="the job's task seed: warm starts, held-out split, exam"
    )
    cli.add_argument("--verifier-target", type=float, help="the verifier's warm-up target")
    cli.add_argument(
        "--solver-dev",
        action="store_true",
        help="stop the verifier's warm-up on the warm-started solver's own answers to training"
        " problems (`evaluation.verifier_dev`), not on near misses as its trainer does",
    )
    cli.add_argument("--save", type=Path, help="write the trained verifier's weights here")
    return cli.parse_args()


def warmed(trainer: Trainer, spec: Any, cache: Path, *, dev: list[base.Problem]) -> None:
    """The trainer's warm start (measured on `dev` if given), from the cache when it was made
    before from the same settings: the task's, and the trainers' up to this one (a verifier's
    dev comes from the warm-started solver before it)."""
    upto = [p.name for p in spec.policies].index(trainer.policy.name) + 1
    trainers = [p.trainer.model_dump() for p in spec.policies[:upto]]
    made_from = json.dumps([spec.workflow.task.model_dump(), trainers, bool(dev)], sort_keys=True)
    key = hashlib.sha256(made_from.encode()).hexdigest()[:12]
    path = cache / f"{trainer.policy.name}-{key}.safetensors"
    if path.exists():
        trainer.model.load_state_dict(safetensors.torch.load_file(path))
        return
    made = evaluation.warm_start(trainer, spec, dev=dev)
    print(json.dumps({"warm_start": trainer.policy.name, **made}))
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.save_weights(trainer.model, path)


def engine_of(trainer: Trainer) -> TorchEngine:
    model = copy.deepcopy(trainer.model)
    torch.nn.Module.to(model, torch.bfloat16)  # in place, as a rollout worker holds it
    return TorchEngine(model, max_batch_size=256)


def decoded(tokenizer: Any, ids: list[int]) -> str:
    """A completion's text (a tokenizer's `decode` is typed to return a list too)."""
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def judged(task: Any, problem: base.Problem, text: str) -> tuple[bool | None, bool, str]:
    """A verifier completion's verdict, whether its working is the answer, and the working."""
    said = verify.parse_verdict(text)
    answer = base.answer_text(text)
    working = answer[:-1] if said is not None else answer
    return said, task.reward(problem, working) > 0.5, working


def reward_of(kind: str, task: Any, problem: base.Problem, text: str, right: bool) -> float:
    said, worked, _ = judged(task, problem, text)
    verdict = verify.verdict_reward(said, right)
    return {
        "verdict": verdict,
        "working": float(worked),
        "both": 0.5 * verdict + 0.5 * worked,
        "gate": verdict * (0.5 + 0.5 * worked),
    }[kind]


def breakdown(
    verifier: Trainer, task: Any, cases: list[base.Problem], answers: list[str], room: int
) -> None:
    """The exam's verdicts by kind: candidate right or wrong, verdict ok or not, the working
    right or not, and whether the working is the candidate's answer (copied) or not."""
    torch.nn.Module.eval(verifier.model)
    prompts = [c.prompt for c in cases]
    outs = warmup.greedy_completions(verifier.model, verifier.tokenizer, prompts, room)
    kinds: Counter[str] = Counter()
    for problem, answer, case, out in zip(task.held_out(), answers, cases, outs, strict=False):
        said, worked, working = judged(task, problem, out)
        right = verify.truth(case)
        kinds[
            f"{'right' if right else 'wrong'} answer, {'ok' if said == right else 'MISTAKEN'}, "
            f"working {'right' if worked else 'wrong'}, "
            f"{'copied' if working == base.answer_text(answer) else 'own'}"
        ] += 1
    print(json.dumps({"exam_breakdown": dict(sorted(kinds.items()))}), flush=True)


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    spec = jobfile.load(args.job).spec
    if args.temperature is not None:
        spec.algorithm.temperature = args.temperature
    if args.task_seed is not None:
        spec.workflow.task.seed = args.task_seed
    judge = spec.policies[1]
    if args.verifier_target is not None:
        judge.trainer.warmup_target_accuracy = args.verifier_target
    if args.lr is not None:
        judge.trainer.optimizer.lr = args.lr
    if args.updates is not None:
        judge.trainer.updates_per_batch = args.updates
    work = args.cache / f"run-{time.time_ns()}"
    solver = Trainer(spec.policies[0], spec.algorithm, workdir=work / "solver")
    verifier = Trainer(judge, spec.algorithm, workdir=work / "verifier")
    warmed(solver, spec, args.cache, dev=[])
    dev = []
    if args.solver_dev:
        answers = evaluation.solver_dev_answers(solver.model, solver.tokenizer, spec)
        dev = evaluation.verifier_dev(answers, spec)
    warmed(verifier, spec, args.cache, dev=dev)
    task = tasks.load_task(spec.workflow.task)
    answers = evaluation.solver_answers(solver.model, solver.tokenizer, spec)
    cases = evaluation.exam_cases(answers, spec)
    solvers = [engine_of(solver)]
    if args.late is not None:
        solver.model.load_state_dict(safetensors.torch.load_file(args.late))
        solvers.append(engine_of(solver))
    rollout = engine_of(verifier)
    room = evaluation.room(judge.name, spec)

    def exam(step: int, **figures: float) -> None:
        torch.nn.Module.eval(verifier.model)
        score = warmup.balanced_verdict_accuracy(
            verifier.model, verifier.tokenizer, verify.VerificationTask(task), cases,
            max_new_tokens=room,
        )  # fmt: skip
        print(json.dumps({"step": step, "exam": round(score, 4), **figures}), flush=True)

    breakdown(verifier, task, cases, answers, room)
    exam(0)
    rng = random.Random(args.seed)
    rewards: list[float] = []
    hits: list[float] = []
    for step in range(1, args.steps + 1):
        samples = episodes(args, spec, task, solvers, rollout, verifier, rng, rewards, hits)
        stats = verifier.step(samples)
        verifier.state.version += 1
        rollout.load_weights(verifier.bf16())
        if step % args.every == 0:
            mean = sum(rewards) / len(rewards)
            exam(step, reward=round(mean, 3), verdicts=round(sum(hits) / len(hits), 3),
                 trained=round(stats.get("trained_fraction", 0.0), 3))  # fmt: skip
            rewards.clear()
            hits.clear()
    breakdown(verifier, task, cases, answers, room)
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.save_weights(verifier.model, args.save)


def episodes(
    args: argparse.Namespace,
    spec: Any,
    task: Any,
    solvers: list[TorchEngine],
    rollout: TorchEngine,
    verifier: Trainer,
    rng: random.Random,
    rewards: list[float],
    hits: list[float],
) -> list[batching.Sample]:
    """One step's verifier samples: the workflow's episodes against fixed solvers."""
    tok = verifier.tokenizer
    stop = (tok.eos_token_id,)
    answer = SamplingParams(max_new_tokens=spec.algorithm.max_new_tokens, temperature=0.6,
                            stop_token_ids=stop)  # fmt: skip
    verdict = SamplingParams(max_new_tokens=evaluation.room(verifier.policy.name, spec),
                             temperature=spec.algorithm.temperature, stop_token_ids=stop)  # fmt: skip
    shown = []
    for _ in range(PROBLEMS):
        problem = task.sample(rng)
        late = len(solvers) > 1 and rng.random() < args.late_share
        outs = solvers[int(late)].generate([tok(problem.prompt)["input_ids"]] * GROUP, answer)
        texts = [decoded(tok, o.tokens) for o in outs]
        correct = [task.reward(problem, t) > 0.5 for t in texts]
        shown += [(problem, texts[i], correct[i]) for i in balanced_pick(correct, rng)]
    prompts = [
        tok(verify.verify_prompt(p, t))["input_ids"] for p, t, _ in shown for _ in range(GROUP)
    ]
    samples = []
    for k, out in enumerate(rollout.generate(prompts, verdict)):
        problem, _, right = shown[k // GROUP]
        text = decoded(tok, out.tokens)
        reward = reward_of(args.reward, task, problem, text, right)
        rewards.append(reward)
        hits.append(verify.verdict_reward(verify.parse_verdict(text), right))
        samples.append(
            batching.Sample(
                prompt_ids=prompts[k], completion_ids=out.tokens, behaviour_logprobs=out.logprobs,
                reward=reward, group_id=str(k // GROUP), weight_version=verifier.state.version,
            )
        )  # fmt: skip
    return samples


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
