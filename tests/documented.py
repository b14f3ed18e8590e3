"""The commands the docs tell users to run, read from the docs themselves.

Tests run these commands as written (with the few substitutions the test machine needs,
listed where they are made), so a changed README changes what is tested. Sources:

- README.md and charts/polyrl/README.md: every line of a ```bash block (continuation lines
  joined, trailing `# ...` comments dropped), with the heading it stands under;
- charts/polyrl/templates/NOTES.txt: lines indented by two spaces (the Helm template
  expressions left in);
- examples/*.yaml: header comment lines indented by three spaces (`#   <command>`).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MARKDOWN = ("README.md", "charts/polyrl/README.md")
NOTES = "charts/polyrl/templates/NOTES.txt"
COMMAND_WORDS = ("kubectl", "helm", "polyrl", "make", "python", "export", ".")


@dataclass(frozen=True, slots=True)
class Command:
    source: str  # a path relative to the repository
    heading: str  # the Markdown heading above it ("" elsewhere)
    text: str


def _strip_comment(line: str) -> str:
    return re.split(r"\s{2,}#|^#", line, maxsplit=1)[0].rstrip()


def _markdown(source: str) -> list[Command]:
    found: list[Command] = []
    heading, in_bash, pending = "", False, ""
    for line in (REPO / source).read_text().splitlines():
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            continue
        if not in_bash:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            continue
        text = _strip_comment(line.strip())
        if not text:
            continue
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        found.append(Command(source, heading, pending + text))
        pending = ""
    return found


def _notes() -> list[Command]:
    lines = (REPO / NOTES).read_text().splitlines()
    return [
        Command(NOTES, "", line.strip())
        for line in lines
        if line.startswith("  ") and line.strip().split(" ", 1)[0] in COMMAND_WORDS
    ]


def _example_headers() -> list[Command]:
    found = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            if line.startswith("#   "):
                text = _strip_comment(line[4:].strip())
                found.append(Command(str(path.relative_to(REPO)), "", text))
    return found


def commands() -> list[Command]:
    """Every documented command, in the order the docs give them."""
    found = [c for source in MARKDOWN for c in _markdown(source)]
    return found + _notes() + _example_headers()


def block(source: str, heading: str) -> list[str]:
    """The commands of one section of a Markdown file, in order."""
    found = [c.text for c in commands() if c.source == source and c.heading == heading]
    assert found, f"no commands under {heading!r} in {source}"
    return found


def run_example(
    example: str, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """Run an example as its header says (`example_run`), in `tmp_path`, into
    `tmp_path/run`; the finished process (asserted to have succeeded) and its metrics."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        example_run(example, run_dir),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return proc, [json.loads(line) for line in lines]


def example_run(example: str, run_dir: Path) -> list[str]:
    """The `polyrl run` line in an example's header, as argv to run here: this interpreter's
    polyrl, the run directory `run_dir`, and the example by absolute path (so a test may run
    it from elsewhere and its workflow module is still found beside the job file)."""
    runs = [c.text for c in commands() if c.source == example]
    assert len(runs) == 1, runs
    assert runs[0].startswith("polyrl run "), runs
    argv = shlex.split(runs[0])
    argv[argv.index("--run-dir") + 1] = str(run_dir)
    argv[argv.index(example)] = str(REPO / example)
    argv[0:1] = [sys.executable, "-m", "polyrl.cli"]
    return argv
