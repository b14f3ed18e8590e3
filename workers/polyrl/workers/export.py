"""`polyrl export`: a trained policy as a Hugging Face directory other tools load as is.

A trainer checkpoint (`checkpoint.py`) already holds the weights, the model's config and the
tokenizer; exporting adds nothing but a clean copy without optimizer state, in the dtype asked
for, written atomically (a half-written export never looks finished). The source may be the
checkpoint directory itself (on a cluster: in the policy's checkpoint claim, where
`status.policies[].output` points), a `polyrl run` run directory, where the policy's
checkpoint is found by name, or a job's NATS, `nats://<host>:<port>/<namespace>/<job>`,
where the latest announced weights are read from the policy's Object Store bucket with the
model bundle (config and tokenizer) beside them, exactly as a rollout worker reads them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from polyrl.workers.models import loading as models
from polyrl.workers.trainer import checkpoint, sharded_checkpoint

NATS_SCHEMES = ("nats://", "tls://")

DTYPES = ("bfloat16", "float16", "float32")


class ExportError(Exception):
    """The source holds no usable checkpoint, or the policy is ambiguous or unknown."""


def find_checkpoint(source: Path, policy: str | None) -> Path:
    """The checkpoint directory `source` names: itself, or one of a run directory's."""
    if (source / checkpoint.STATE).is_file():
        return source
    if not source.is_dir():
        raise ExportError(f"{source}: no such directory")
    found = {
        path.parent.parent.name: path.parent
        for path in sorted(source.glob(f"**/checkpoint/{checkpoint.STATE}"))
    }
    if not found:
        raise ExportError(f"{source}: no trainer checkpoint in it (looked for */checkpoint/)")
    if policy is None:
        if len(found) > 1:
            raise ExportError(
                f"{source} has several policies, pick one with --policy: {sorted(found)}"
            )
        return next(iter(found.values()))
    if policy not in found:
        raise ExportError(f"{source}: no checkpoint of policy {policy!r}; it has {sorted(found)}")
    return found[policy]


def export_checkpoint(
    directory: Path, out_dir: Path, *, dtype: str = "bfloat16", adapter: bool = False
) -> Path:
    """Write the checkpoint in `directory` as an HF directory at `out_dir` (must not exist):
    the model (a LoRA policy's merged with its base), or with `adapter` a LoRA policy's
    adapter alone, in PEFT's format, with the tokenizer."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not (directory / "config.json").is_file():
        raise ExportError(
            f"{directory}: the checkpoint has no config.json (written by an older polyrl?)"
        )
    if out_dir.exists():
        raise ExportError(f"{out_dir} already exists; choose a new output directory")
    has_adapter = (directory / checkpoint.ADAPTER_WEIGHTS).is_file()
    if adapter and not has_adapter:
        raise ExportError(f"{directory}: --adapter needs a LoRA policy's checkpoint (no adapter)")
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        if adapter:
            for name in (checkpoint.ADAPTER_WEIGHTS, checkpoint.ADAPTER_CONFIG):
                shutil.copy2(directory / name, staging / name)
            tokenizer.save_pretrained(staging)
        else:
            model = merged(directory, dtype) if has_adapter else _load(directory, dtype)
            models.export(model, tokenizer, staging)
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _load(directory: Path, dtype: str) -> Any:
    if sharded_checkpoint.holds_shards(directory):  # a sharded trainer's: assembled here
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        sharded_checkpoint.whole_weights(directory, model)
        return model.to(getattr(torch, dtype))
    return AutoModelForCausalLM.from_pretrained(
        directory, dtype=getattr(torch, dtype), local_files_only=True
    )


def merged(directory: Path, dtype: str) -> Any:
    """A LoRA checkpoint's model: its base, loaded from the source it was trained from (by
    the loading code trainers use), with the adapter merged in float32, then cast."""
    from peft import PeftModel

    from polyrl.api.model_source import ModelSource

    if not (directory / checkpoint.BASE).is_file():
        raise ExportError(f"{directory}: a LoRA checkpoint without {checkpoint.BASE}")
    source = ModelSource.model_validate_json((directory / checkpoint.BASE).read_text())
    # Where the trainer built or converted its base, beside the checkpoint; else anew.
    cache = directory.parent / "models"
    with tempfile.TemporaryDirectory(prefix="polyrl-export-base-") as scratch:
        try:
            base, _ = models.make_model(
                source.model_copy(update={"dtype": "float32"}),
                cache_dir=cache if cache.is_dir() else Path(scratch),
            )
        except (OSError, ValueError) as err:
            raise ExportError(f"the base model {source.path!r} cannot be loaded: {err}") from None
        model = PeftModel.from_pretrained(base, directory).merge_and_unload()
    return model.to(getattr(torch, dtype))


def parse_nats_source(source: str) -> tuple[str, str, str]:
    """`nats://host:port/<namespace>/<job>` -> (server URL, namespace, job)."""
    url = urllib.parse.urlsplit(source)
    parts = [p for p in url.path.split("/") if p]
    if len(parts) != 2:
        raise ExportError(f"{source}: name the job as nats://<host>:<port>/<namespace>/<job>")
    return f"{url.scheme}://{url.netloc}", parts[0], parts[1]


def export_from_nats(
    source: str, policy: str | None, out_dir: Path, *, dtype: str = "bfloat16"
) -> tuple[Path, int]:
    """The latest weights `policy`'s trainer announced, as an HF directory; and their version."""
    if policy is None:
        raise ExportError("a job in NATS may hold several policies: pick one with --policy")
    if out_dir.exists():
        raise ExportError(f"{out_dir} already exists; choose a new output directory")
    server, namespace, job = parse_nats_source(source)
    with tempfile.TemporaryDirectory(prefix="polyrl-export-") as scratch:
        directory, version = asyncio.run(
            _fetch(server, namespace, job, policy, Path(scratch) / "checkpoint")
        )
        return export_checkpoint(directory, out_dir, dtype=dtype), version


async def _fetch(
    server: str, namespace: str, job: str, policy: str, dest: Path
) -> tuple[Path, int]:
    import nats

    from polyrl.api.naming import JobNames
    from polyrl.workers.weightsync import announce, bundle
    from polyrl.workers.weightsync.store import WeightStore
    from polyrl.workers.weightsync.sync import WeightSync

    try:
        nc = await nats.connect(server, connect_timeout=5, max_reconnect_attempts=0)
    except Exception as err:
        raise ExportError(f"cannot reach NATS at {server}: {type(err).__name__}") from None
    try:
        js, names = nc.jetstream(), JobNames(namespace=namespace, job=job)
        latest = await announce.latest(js, names, policy)
        if latest is None:
            raise ExportError(f"job {namespace}/{job} has no weights of policy {policy!r} in NATS")
        await bundle.fetch(js, names, policy, dest, timeout=10)
        sync = WeightSync(await WeightStore.open(js, names.weights_bucket(policy)))
        await sync.follow(latest)
        assert sync.state is not None
        config = AutoConfig.from_pretrained(dest, local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
        model.load_state_dict(sync.state)
        model.save_pretrained(dest)
        return dest, latest.version
    finally:
        await nc.close()
