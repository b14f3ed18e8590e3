"""Model paths that name something other than a local directory: `hf://` and `pvc://`.

* `hf://<org>/<name>[@<revision>]` is resolved through huggingface_hub's cache
  (`snapshot_download`): with `HF_HUB_OFFLINE=1` only what the cache holds is used (a missing
  model is an error naming the repository and the cache), otherwise a missing snapshot is
  downloaded into the cache first. The revision is a branch, a tag or a commit (default
  `main`). `HF_HUB_CACHE` / `HF_HOME` say where the cache is, as for every Hugging Face tool.
  `hf://<org>/<name>/<file>.gguf[@<revision>]` names one GGUF file of a repository (fetched
  alone, `hf_hub_download`), which `models.gguf` then converts.
* `pvc://<claim>/<path>` names a path inside a PersistentVolumeClaim. Under the operator the
  trainer's pods mount each such claim read-only at `/mnt/polyrl/pvc/<claim>`
  (`polyrl.api.launch.PVC_ROOT`), and the path resolves below it; the root can be moved with
  `POLYRL_PVC_ROOT` (what `polyrl run` does not set: on one machine, give a local path).

Only the trainer resolves these for models (rollout workers get the model from the job's
Object Store); the `dataset` task resolves `pvc://` data files the same way, in the workflow
runner's and the trainers' pods.
"""

from __future__ import annotations

import os
from pathlib import Path

from polyrl.api.launch import DATA_ROOT_ENV, DATA_ROOTS, PVC_ROOT, PVC_ROOT_ENV
from polyrl.api.model_source import pvc_parts, volume_parts

HF_SCHEME = "hf://"
PVC_SCHEME = "pvc://"
_TRUE = {"1", "true", "yes", "on"}


def parse_hf(uri: str) -> tuple[str, str | None]:
    """`hf://org/name@rev` -> ("org/name", "rev"); ValueError when it is not of that form."""
    repo, file, revision = parse_hf_file(uri)
    if file is not None:
        raise ValueError(f"model {uri!r}: expected hf://<org>/<name>[@<revision>]")
    return repo, revision


def parse_hf_file(uri: str) -> tuple[str, str | None, str | None]:
    """`hf://org/name/dir/f.gguf@rev` -> ("org/name", "dir/f.gguf", "rev"); the file is None
    for a whole repository. Only GGUF files may be named alone (a model is one file only
    in that format)."""
    body = uri.removeprefix(HF_SCHEME)
    repo, _, revision = body.partition("@")
    parts = repo.split("/")
    file = "/".join(parts[2:]) or None
    if (
        len(parts) < 2
        or not all(parts)
        or ".." in parts
        or (file is not None and not file.lower().endswith(".gguf"))
    ):
        raise ValueError(
            f"model {uri!r}: expected hf://<org>/<name>[@<revision>] or "
            "hf://<org>/<name>/<file>.gguf[@<revision>]"
        )
    return "/".join(parts[:2]), file, revision or None


def offline() -> bool:
    """Whether Hugging Face's offline mode is on, read now (not at import time)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def resolve_hf(uri: str, *, cache_dir: Path | None = None) -> Path:
    """The local snapshot directory (or GGUF file) of an `hf://` model (module docstring)."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    repo, file, revision = parse_hf_file(uri)
    try:
        if file is not None:
            path = hf_hub_download(
                repo, file, revision=revision, cache_dir=cache_dir, local_files_only=offline()
            )
        else:
            path = snapshot_download(
                repo, revision=revision, cache_dir=cache_dir, local_files_only=offline()
            )
    except LocalEntryNotFoundError:
        where = cache_dir or os.environ.get("HF_HUB_CACHE") or "the Hugging Face cache"
        raise ValueError(
            f"model {uri!r} is not in {where} and HF_HUB_OFFLINE is set: download it first "
            f"(`hf download {repo}`) or unset HF_HUB_OFFLINE"
        ) from None
    except (HFValidationError, OSError) as err:
        raise ValueError(f"model {uri!r}: {err}") from None
    return Path(path)


def resolve_pvc(uri: str, *, what: str = "model") -> Path:
    """The mounted path of a `pvc://claim/path` model or data file (see the module docstring)."""
    claim, sub = pvc_parts(uri, what=what)
    root = Path(os.environ.get(PVC_ROOT_ENV, PVC_ROOT)) / claim
    if not root.is_dir():
        raise ValueError(
            f"{what} {uri!r}: claim {claim!r} is not mounted at {root}; pvc:// paths work "
            "under the operator (which mounts the claim); on one machine give a local path"
        )
    return root / sub


def resolve_data(uri: str) -> Path:
    """The mounted path of a data file named `pvc://`, `configmap://` or `secret://`; a local
    path as it is. The operator mounts the volume a data file names in the pods that read
    it; under `polyrl run` nothing is mounted, and the error says so."""
    if uri.startswith(PVC_SCHEME):
        return resolve_pvc(uri, what="dataset")
    for kind, mounted in DATA_ROOTS.items():
        if uri.startswith(f"{kind}://"):
            name, key = volume_parts(uri, kind, what="dataset")
            override = os.environ.get(DATA_ROOT_ENV)
            root = Path(override) / kind / name if override else Path(mounted) / name
            if not root.is_dir():
                raise ValueError(
                    f"dataset {uri!r}: {kind} {name!r} is not mounted at {root}; {kind}:// "
                    "paths work under the operator (which mounts it); on one machine give a "
                    "local path"
                )
            return root / key
    return Path(uri)


def resolve(path: str, *, cache_dir: Path | None = None) -> str:
    """`path` as a local directory where it is an `hf://` or `pvc://` URI; else the local
    path, with a leading `~` expanded (so that a job file can name the user's model cache,
    such as `~/.cache/polyrl/models/...`, where `polyrl models fetch` puts files)."""
    if path.startswith(HF_SCHEME):
        return str(resolve_hf(path, cache_dir=cache_dir))
    if path.startswith(PVC_SCHEME):
        return str(resolve_pvc(path))
    return os.path.expanduser(path)
