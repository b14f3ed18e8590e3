"""What a local run shows and leaves behind: live progress, and a PNG of reward by step.

Both read the run's metrics JSONL (one line per trainer step per policy), so they need no
connection to the workers and work the same on a finished run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def read_metrics(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Lines by policy, in step order; a torn last line (a writer mid-append) is skipped."""
    by_policy: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not path.is_file():
        return {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        by_policy[record["policy"]].append(record)
    for records in by_policy.values():
        records.sort(key=lambda r: r["step"])
    return dict(by_policy)


def summary(metrics: dict[str, list[dict[str, Any]]]) -> str:
    parts = []
    for policy, records in sorted(metrics.items()):
        last = records[-1]
        recent = records[-5:]
        reward = sum(r.get("reward", 0.0) for r in recent) / len(recent)
        text = f"{policy}: step {last['step']} v{last['version']} reward {reward:.2f}"
        if "accuracy" in last:
            text += f" acc {last['accuracy']:.2f}"
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
        steps = [r["step"] for r in records]
        ax.plot(steps, [r.get("reward", 0.0) for r in records], label=f"{policy} reward")
        evals = [r for r in records if "accuracy" in r]
        if evals:
            ax.plot(
                [r["step"] for r in evals],
                [r["accuracy"] for r in evals],
                "o--",
                label=f"{policy} held-out accuracy",
            )
    ax.set_xlabel("trainer step")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
