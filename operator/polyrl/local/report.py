"""What a local run shows and leaves behind: live progress, and a PNG of reward by step.

Both read the run's metrics JSONL (one line per trainer step per policy), so they need no
connection to the workers and work the same on a finished run. The workflow runner's lines
(`"source": "workflow"`: how well a verifier judges, per window of its versions) are not
trainer steps and are left out here.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def read_metrics(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Trainer lines by policy, in step order; a torn last line (mid-append) is skipped."""
    by_policy: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not path.is_file():
        return {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("source", "trainer") == "trainer":
            by_policy[record["policy"]].append(record)
    for records in by_policy.values():
        records.sort(key=lambda r: r["step"])
    return dict(by_policy)


def summary(metrics: dict[str, list[dict[str, Any]]]) -> str:
    parts = []
    for policy, records in sorted(metrics.items()):
        last = records[-1]
        recent = records[-5:]
        rewards = [r["reward"] for r in recent if "reward" in r]
        reward = sum(rewards) / len(rewards) if rewards else 0.0
        text = f"{policy}: step {last['step']} v{last['version']} reward {reward:.2f}"
        if "staleness" in last:
            text += f" stale {last['staleness']:.1f}"
        evals = [r for r in records if "accuracy" in r or "balanced_accuracy" in r]
        if evals:
            figure = evals[-1].get("accuracy", evals[-1].get("balanced_accuracy"))
            text += f" acc {figure:.2f}"
        parts.append(text)
    return " | ".join(parts) or "waiting for the first step"


def plot(metrics: dict[str, list[dict[str, Any]]], out: Path) -> Path | None:
    if not metrics:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, records in sorted(metrics.items()):
        trained = [r for r in records if "reward" in r]
        ax.plot(
            [r["step"] for r in trained], [r["reward"] for r in trained], label=f"{policy} reward"
        )
        for key, label in (
            ("accuracy", "held-out accuracy"),
            ("balanced_accuracy", "balanced acc."),
        ):
            evals = [r for r in records if key in r]
            if evals:
                ax.plot(
                    [r["step"] for r in evals],
                    [r[key] for r in evals],
                    "o--",
                    label=f"{policy} {label}",
                )
    ax.set_xlabel("trainer step")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
