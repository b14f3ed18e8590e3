"""Can a tiny verifier learn to judge sums? A plain verdict against worked ones.

docs/benchmarks.md ("Learning") explains why a verifier that writes its verdict alone stays at
chance: with that format ("12+39=15?" -> "y") the verdict depends on the ones digits of both
operands and of the candidate only jointly, so no single token carries a signal and supervised
training sits at ln 2 per verdict. This script trains a fresh tiny Llama, supervised,
on either format and prints its balanced accuracy (right vs near-miss candidates, half each) on
held-out problems every 200 steps:

* `plain`: the verdict alone, the target shipped before worked verdicts;
* `worked`: the ones digit the verifier computes, then the verdict ("12+39=15?" -> "1y"), so the
  verdict becomes a comparison of two tokens the model can see;
* `worked-full`: the whole answer the verifier computes, then the verdict ("15y"): the form
  any task can use (the task's own reference answer as the working), shipped in `workflows.solver_verifier.verdicts`.

    .venv/bin/python scripts/verifier_format.py --format worked-full --usual  # 0.95 at 600 steps
    .venv/bin/python scripts/verifier_format.py --format worked            # 0.50 -> 0.80 at 2,400 steps
    .venv/bin/python scripts/verifier_format.py --format plain --answer-steps 3000

`--answer-steps` first warms the model up on the task's answers (to 90 % dev accuracy or that
many steps), to rule out "it cannot add" as the reason. Answers are reversed (least significant
digit first, the `arithmetic` task's `reverse`) unless `--usual`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("operator", "workers")]

from polyrl.api.resources import ModelSource  # noqa: E402
from polyrl.workers.models import loading as models  # noqa: E402
from polyrl.workers.tasks import arithmetic, base  # noqa: E402
from polyrl.workers.trainer import warmup  # noqa: E402
from polyrl.workers.workflows.solver_verifier import verdicts as verify  # noqa: E402


class Verdicts:
    """Verification problems with one of the three targets (the product's is `worked-full`)."""

    name = "verdicts"

    def __init__(self, task: arithmetic.Arithmetic, form: str) -> None:
        self.task, self.judge, self.form = task, verify.VerificationTask(task), form

    def target(self, problem: base.Problem, verdict: str) -> str:
        """The verdict alone, after the ones digit, or after the whole answer."""
        ones = problem.answer[0] if self.task.reverse else problem.answer[-1]
        working = {"plain": "", "worked": ones, "worked-full": problem.answer}[self.form]
        return working + verdict

    def sample(self, rng: random.Random) -> base.Problem:
        problem = self.task.sample(rng)
        judged = self.judge.judged(problem, rng.random() < 0.5, rng)
        return base.Problem(judged.prompt, self.target(problem, judged.answer[-1]), judged.id)

    def reward(self, problem: base.Problem, completion: str) -> float:
        return 1.0 if base.answer_text(completion) == problem.answer else 0.0

    def held_out(self) -> list[base.Problem]:
        return []  # the script scores its own cases (`balanced_accuracy`)


def balanced_accuracy(model: torch.nn.Module, tok: object, cases: list[base.Problem]) -> float:
    """Mean of the hit rates on right and on near-miss candidates (as `warmup` scores it).

    The verdict is the completion's last character, whatever working comes before it.
    """
    outs = warmup.greedy_completions(model, tok, [c.prompt for c in cases], max_new_tokens=5)  # type: ignore[arg-type]
    hits: dict[bool, list[bool]] = {True: [], False: []}
    for case, out in zip(cases, outs, strict=True):
        right = verify.truth(case)
        hits[right].append(verify.parse_verdict(out) == right)
    return sum(sum(h) / len(h) for h in hits.values()) / 2


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--format", choices=["plain", "worked", "worked-full"], default="worked")
    cli.add_argument("--answer-steps", type=int, default=0, help="warm-up on answers first")
    cli.add_argument("--steps", type=int, default=3000, help="steps on verdicts, batch 128")
    cli.add_argument("--lr", type=float, default=3e-3)
    cli.add_argument("--usual", action="store_true", help="answers most significant digit first")
    cli.add_argument("--model", default="exp-verifier", help="tiny-llama:// name (its init)")
    cli.add_argument("--cache", type=Path, default=Path("/tmp/polyrl-verifier-format"))
    args = cli.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    source = ModelSource(path=f"tiny-llama://{args.model}", dtype="float32")
    model, tok = models.make_model(source, cache_dir=args.cache)
    task = arithmetic.Arithmetic(digits=2, ops="+", held_out=1000, seed=0, reverse=not args.usual)
    started = time.perf_counter()
    if args.answer_steps:
        dev_rng = random.Random(5)
        warmed = warmup.supervised_warmup(
            model, tok, task, steps=args.answer_steps, batch_size=128, lr=3e-3, seed=0,
            target=0.9, dev=[task.sample(dev_rng) for _ in range(200)], check_every=50,
            max_new_tokens=4,
        )  # fmt: skip
        print(f"answers: {warmed['steps']:.0f} steps, dev {warmed['dev_accuracy']:.2f}")
    judge = verify.VerificationTask(task)
    rng = random.Random(0)
    cases = [judge.judged(p, right, rng) for p in task.held_out()[:300] for right in (True, False)]
    training = Verdicts(task, args.format)
    for chunk in range(args.steps // 200):
        result = warmup.supervised_warmup(
            model, tok, training, steps=200, batch_size=128, lr=args.lr, seed=chunk + 10
        )
        score = balanced_accuracy(model, tok, cases)
        print(
            f"{args.format} {(chunk + 1) * 200} steps: loss {result['final_loss']:.3f}, "
            f"balanced accuracy {score:.3f} ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
