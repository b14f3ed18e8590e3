"""Run one RLJob once per objective and seed, then tabulate and plot what each run did.

    .venv/bin/python scripts/compare_objectives.py examples/quickstart.yaml \\
        --objectives grpo,gspo,dapo,m2po,cispo --seeds 0,1 --out runs/objectives

Each run is `polyrl run` of the job with `algorithm.loss.name` set (and `workflow.task.seed`
to the seed; `--lora R` adds `trainer.lora: {rank: R}` to every trained policy, `--steps N`
sets `stop.steps`, `--lr X` every trainer's learning rate), in `OUT/<objective>-s<seed>/`; a
run whose directory already holds a finished `summary.json` is not run again, so an
interrupted comparison resumes. Then, from
every run's `metrics.jsonl`: each policy's held-out figure at every evaluation, the median
seconds per step, and the mean importance-weight figures (`is_deviation`, `clip_frac`,
`is_m2`), as `OUT/comparison.json`, a Markdown table `OUT/comparison.md` and a plot of
held-out curves `OUT/comparison.png` (mean over seeds, one line per objective).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

FIGURES = ("is_deviation", "clip_frac", "is_m2")


def job_for(
    doc: dict[str, Any], objective: str, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    job: dict[str, Any] = json.loads(json.dumps(doc))
    spec = job["spec"]
    spec.setdefault("algorithm", {})["loss"] = {"name": objective}
    spec.setdefault("workflow", {}).setdefault("task", {})["seed"] = seed
    if args.steps:
        spec.setdefault("stop", {})["steps"] = args.steps
        for policy in spec["policies"]:
            policy.get("trainer", {}).pop("steps", None)
    for policy in spec["policies"]:
        if policy.get("frozen"):
            continue
        trainer = policy.setdefault("trainer", {})
        if args.lora:
            trainer["lora"] = {"rank": args.lora}
        if args.lr:
            trainer.setdefault("optimizer", {})["lr"] = args.lr
    job["metadata"]["name"] = f"{job['metadata']['name']}-{objective}-s{seed}"
    return job


def run_one(job: dict[str, Any], run_dir: Path, polyrl: str) -> float:
    """`polyrl run` the job in `run_dir`; its wall seconds (0 if it had finished before)."""
    done = run_dir / "summary.json"
    if done.exists():
        return float(json.loads(done.read_text())["wall_seconds"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    print(f"compare: {run_dir.name} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    with (run_dir / "run.log").open("w") as log:
        subprocess.run(
            [polyrl, "run", str(run_dir / "job.yaml"), "--run-dir", str(run_dir)],
            check=True, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    wall = time.monotonic() - started
    done.write_text(json.dumps({"wall_seconds": wall}))
    return wall


def summarise(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Per policy: held-out by step, median step seconds, mean IS figures over RL steps."""
    out: dict[str, dict[str, Any]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        policy = record.get("policy")
        if policy is None or "step" not in record:
            continue
        mine = out.setdefault(
            policy, {"held_out": {}, "step_seconds": [], **{f: [] for f in FIGURES}}
        )
        if record.get("held_out") is not None:
            mine["held_out"][int(record["step"])] = record["held_out"]
        if record.get("step_seconds") is not None and record["step"] > 0:
            mine["step_seconds"].append(record["step_seconds"])
        for figure in FIGURES:
            if record.get(figure) is not None:
                mine[figure].append(record[figure])
    for mine in out.values():
        mine["step_seconds"] = _median(mine["step_seconds"])
        for figure in FIGURES:
            mine[figure] = _mean(mine[figure])
    return out


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def table(results: dict[str, dict[str, Any]]) -> str:
    """One row per objective, seed and policy: held-out start -> end (best), step time, IS."""
    lines = [
        "| objective | seed | policy | held-out: RL start → end (best) | s/step | mean \\|w−1\\| | clipped | M2 | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in sorted(results.items()):
        objective, seed = name.rsplit("-s", 1)
        for policy, f in sorted(run["policies"].items()):
            curve = sorted(f["held_out"].items())
            if not curve:
                continue
            start, end, best = curve[0][1], curve[-1][1], max(v for _, v in curve)
            clipped = "" if f["clip_frac"] is None else f"{100 * f['clip_frac']:.2f} %"
            lines.append(
                f"| {objective} | {seed} | {policy} | {start:.3f} → {end:.3f} ({best:.3f}) | "
                f"{f['step_seconds']} | {f['is_deviation']} | {clipped} | {f['is_m2']} | "
                f"{run['wall_seconds'] / 60:.1f} min |"
            )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = sorted({p for run in results.values() for p in run["policies"]})
    fig, axes = plt.subplots(1, len(policies), figsize=(6 * len(policies), 4), squeeze=False)
    for ax, policy in zip(axes[0], policies, strict=True):
        by_objective: dict[str, list[dict[int, float]]] = {}
        for name, run in results.items():
            curve = run["policies"].get(policy, {}).get("held_out")
            if curve:
                by_objective.setdefault(name.rsplit("-s", 1)[0], []).append(curve)
        for objective, curves in sorted(by_objective.items()):
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            ax.plot(steps, [statistics.fmean(c[s] for c in curves) for s in steps],
                    marker="o", label=f"{objective} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")  # fmt: skip
        ax.set_title(f"{policy}: held-out figure")
        ax.set_xlabel("RL step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", type=Path, help="the RLJob manifest to run once per objective")
    parser.add_argument("--objectives", default="grpo,gspo,dapo,m2po,cispo")
    parser.add_argument("--seeds", default="0,1", help="workflow.task.seed values")
    parser.add_argument("--out", type=Path, default=Path("runs/objectives"))
    parser.add_argument("--lora", type=int, default=0, help="add trainer.lora of this rank")
    parser.add_argument("--steps", type=int, default=0, help="set stop.steps")
    parser.add_argument("--lr", type=float, default=0.0, help="set every trainer's lr")
    parser.add_argument("--polyrl", default=str(Path(sys.executable).with_name("polyrl")))
    args = parser.parse_args(argv)
    doc = yaml.safe_load(args.job.read_text())
    results: dict[str, dict[str, Any]] = {}
    for objective in args.objectives.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            name = f"{objective}-s{seed}"
            wall = run_one(job_for(doc, objective, seed, args), args.out / name, args.polyrl)
            results[name] = {"wall_seconds": wall, "policies": summarise(args.out / name)}
    (args.out / "comparison.json").write_text(json.dumps(results, indent=1))
    (args.out / "comparison.md").write_text(table(results))
    plot(results, args.out / "comparison.png")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
