"""What a local run shows and leaves behind: live progress, a summary, and a plot.

All of it reads the run's metrics JSONL, so it needs no connection to the workers and works
the same on a finished run. Trainers write one line per step per policy (`"source"` absent
or `"trainer"`) with their held-out figures where they evaluated: `held_out` is the headline
of the policy's evaluation, and step 0 (where RL starts) carries the figures before the
warm-up too (`before_warmup_*`). A line when they enter a stage (warming up, evaluating,
training) goes to `stages.jsonl` beside it. The workflow runner's lines (`"source":
"workflow"`, such as how well a verifier judges) are not trainer steps and are left out.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAGES_FILE = "stages.jsonl"  # the trainers' stages, beside the metrics (workers' runtime)
# Evaluation figures and how plots and summaries name them.
FIGURES = {
    "accuracy": "held-out accuracy",
    "balanced_accuracy": "held-out balanced acc.",
    "answers_balanced_accuracy": "exam balanced acc.",
}


@dataclass(slots=True)
class RunState:
    """What the metrics say so far: trainer lines by policy, and each policy's stage."""

    steps: dict[str, list[dict[str, Any]]]
    stages: dict[str, tuple[str, float]]  # policy -> (stage, since)


def read(path: Path) -> RunState:
    """The metrics so far; a torn last line (mid-append) is skipped."""
    steps: dict[str, list[dict[str, Any]]] = defaultdict(list)
    stages: dict[str, tuple[str, float]] = {}
    for record in _records(path):
        if record.get("source", "trainer") == "trainer":
            steps[record["policy"]].append(record)
    for record in _records(path.with_name(STAGES_FILE)):
        stages[record["policy"]] = (record["stage"], record["time"])
    for records in steps.values():
        records.sort(key=lambda r: r["step"])
    return RunState(dict(steps), stages)


def _records(path: Path) -> list[dict[str, Any]]:
    found = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def read_metrics(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Trainer lines by policy, in step order."""
    return read(path).steps


def held_out(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "held_out" in r]


def policy_line(policy: str, state: RunState, total: int | None, width: int = 0) -> str:
    """One policy's progress: stage, step, version, reward, staleness, held-out figure."""
    records = state.steps.get(policy, [])
    stage, since = state.stages.get(policy, ("starting", time.time()))
    if not records or (stage != "training" and records[-1]["step"] == 0):
        return f"{policy:<{width}}  {stage} ({time.time() - since:.0f} s)"
    last, recent = records[-1], records[-5:]
    rewards = [r["reward"] for r in recent if "reward" in r]
    text = f"{policy:<{width}}  step {last['step']}" + (f"/{total}" if total else "")
    text += f"  v{last['version']}"
    if rewards:
        text += f"  reward {sum(rewards) / len(rewards):.2f}"
    if "staleness" in last:
        text += f"  stale {last['staleness']:.1f}"
    evals = held_out(records)
    if evals:
        text += f"  held-out {evals[0]['held_out']:.3f} -> {evals[-1]['held_out']:.3f}"
    return text


def lines(state: RunState, policies: list[str], budgets: dict[str, int] | None) -> list[str]:
    width = max((len(p) for p in policies), default=0)
    return [policy_line(p, state, (budgets or {}).get(p), width) for p in policies]


def summary(state: RunState, policies: list[str]) -> list[str]:
    """The end of a run: each policy's held-out headline where RL started and at its end,
    and before its warm-up where that was measured."""
    out = []
    width = max((len(p) for p in policies), default=0)
    for policy in policies:
        evals = held_out(state.steps.get(policy, []))
        if not evals:
            out.append(f"{policy:<{width}}  no held-out evaluation")
            continue
        first, last = evals[0], evals[-1]
        text = (
            f"{policy:<{width}}  held-out {first['held_out']:.3f} at step {first['step']} -> "
            f"{last['held_out']:.3f} at step {last['step']}"
        )
        if "before_warmup_held_out" in first:
            text += f" (before its warm-up: {first['before_warmup_held_out']:.3f})"
        out.append(text)
    return out


def plot(state: RunState, out: Path, *, title: str) -> Path | None:
    """Reward and every held-out figure by trainer step, per policy; before-warm-up figures
    as crosses at step 0."""
    if not state.steps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, (policy, records) in enumerate(sorted(state.steps.items())):
        _plot_policy(ax, policy, records, color=f"C{i}")
    ax.set_title(title)
    ax.set_xlabel("trainer step (RL; 0: after the warm-up)")
    ax.set_ylabel("mean reward, held-out figure")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _plot_policy(ax: Any, policy: str, records: list[dict[str, Any]], *, color: str) -> None:
    """One policy in one colour: its reward (solid), each held-out figure (dashed, markers)
    and what that figure was before the warm-up (a cross at step 0)."""
    trained = [r for r in records if "reward" in r]
    steps, rewards = [r["step"] for r in trained], [r["reward"] for r in trained]
    ax.plot(steps, rewards, color=color, alpha=0.6, label=f"{policy} reward")
    for (key, label), marker in zip(FIGURES.items(), "os^v", strict=False):
        evals = [r for r in records if key in r]
        if not evals:
            continue
        xs, ys = [r["step"] for r in evals], [r[key] for r in evals]
        ax.plot(xs, ys, "--", marker=marker, color=color, label=f"{policy} {label}")
        before = [r for r in evals if f"before_warmup_{key}" in r]
        if before:
            ys = [r[f"before_warmup_{key}"] for r in before]
            ax.plot(
                [r["step"] for r in before],
                ys,
                "x",
                color=color,
                markersize=9,
                label=f"{policy} {label} before warm-up",
            )
