"""Rendering the Helm chart, for tests and for the plain-YAML copy in manifests/.

`manifests/polyrl.yaml` is exactly `helm template polyrl charts/polyrl --namespace
polyrl-system` (without CRDs: users apply crds/ first) behind a one-line header. A test
compares it with the chart rendered now; regenerate it with

    python -m polyrl.testing.charts > manifests/polyrl.yaml
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

RELEASE = "polyrl"
NAMESPACE = "polyrl-system"
REGENERATE = "python -m polyrl.testing.charts > manifests/polyrl.yaml"
HEADER = (
    f"# Generated from charts/polyrl by `{REGENERATE}` "
    f"(helm template {RELEASE} charts/polyrl --namespace {NAMESPACE}); do not edit by hand.\n"
)


def render(
    helm: Path,
    chart: Path,
    namespace: str = NAMESPACE,
    values: dict[str, Any] | None = None,
    *,
    release: str = RELEASE,
    include_crds: bool = False,
) -> str:
    """`helm template` of `chart`; raises RuntimeError with helm's stderr when it fails."""
    with tempfile.TemporaryDirectory(prefix="polyrl-chart-") as tmp:
        cmd = [str(helm), "template", release, str(chart), "--namespace", namespace]
        if values:
            values_file = Path(tmp) / "values.yaml"
            values_file.write_text(yaml.safe_dump(values))
            cmd += ["--values", str(values_file)]
        if include_crds:
            cmd.append("--include-crds")
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc.stdout


def manifest_text(helm: Path, chart: Path) -> str:
    """What manifests/polyrl.yaml must contain: the header, then the rendered chart."""
    return HEADER + render(helm, chart)


def main(argv: list[str] | None = None) -> int:
    from polyrl.testing.tools import Tools

    parser = argparse.ArgumentParser(
        prog="python -m polyrl.testing.charts",
        description="Print manifests/polyrl.yaml (the chart rendered as plain YAML).",
    )
    default_chart = Path(__file__).resolve().parents[3] / "charts" / "polyrl"
    if not default_chart.is_dir():
        default_chart = Path.cwd() / "charts" / "polyrl"
    parser.add_argument("--chart", type=Path, default=default_chart, help="the chart directory")
    args = parser.parse_args(argv)
    helm = Tools.from_cache().helm
    if helm is None:
        print("error: helm is not built; run `make tools` first", file=sys.stderr)
        return 1
    sys.stdout.write(manifest_text(helm, args.chart))
    return 0


if __name__ == "__main__":
    sys.exit(main())
