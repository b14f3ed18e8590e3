"""Plot `polyrl bench pipeline --simulated --json`: throughput over time and the grid.

    polyrl bench pipeline --simulated --json > grid.json
    python scripts/plot_pipeline.py grid.json docs/figures/pipeline-simulated.png

Left: samples trained over modelled time in both modes, for the cell the benchmark returns
series for (heavy tail, generation as long as training). Right: every cell's measured
async-over-sync speedup beside the ideal one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def plot(figures: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    plotted = next(c for c in figures["cells"] if "async_series" in c)
    for mode, style in (("async", "-o"), ("sync", "-s")):
        series = plotted[f"{mode}_series"]
        left.plot([t / 60 for t, _ in series], [n for _, n in series], style, label=mode)
    left.set_xlabel("modelled time (minutes)")
    left.set_ylabel("samples trained")
    left.set_title(f"{plotted['tail']} tail, generation:training {plotted['ratio']:g}")
    left.legend()
    cells = figures["cells"]
    labels = [
        f"{c['tail']}\n{c['ratio']:g}" + ("\nmixed" if c.get("hardware") == "mixed" else "")
        for c in cells
    ]
    x = range(len(cells))
    right.bar([i - 0.2 for i in x], [c["ideal_speedup"] for c in cells], 0.4, label="ideal")
    measured = [c["async_vs_sync_speedup"] for c in cells]
    right.bar([i + 0.2 for i in x], measured, 0.4, label="async / sync")
    right.set_xticks(list(x), labels)
    right.set_xlabel("tail, generation:training (mixed: half the replicas at half speed)")
    right.set_ylabel("speedup over sync")
    right.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figures", type=Path, help="the benchmark's JSON output")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args()
    plot(json.loads(args.figures.read_text()), args.out)


if __name__ == "__main__":
    main()
