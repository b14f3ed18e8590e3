"""A benchmark's measurement in a fresh interpreter: `python -m MODULE SPEC OUT`.

The trainer and LoRA benchmarks measure each configuration in its own process, so that each
peak resident memory is its own and nothing one configuration allocated or warmed up reaches
the next. SPEC is a JSON file saying what to measure; the probe writes its figures to OUT as
one JSON object.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run(module: str, name: str, spec: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Run probe `module` on `spec` (files named `name` in `scratch`) and return its figures;
    its output goes to stderr, so that `--json` keeps stdout to the one object."""
    spec_file, out = scratch / f"{name}.json", scratch / f"{name}-out.json"
    spec_file.write_text(json.dumps(spec))
    command = [sys.executable, "-m", module, str(spec_file), str(out)]
    print(f"{module.rsplit('.', 1)[-1]}: {name} ...", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, stdout=sys.stderr)
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures
