"""A sharded trainer's checkpoints (`strategy: fsdp2`): torch.distributed.checkpoint (DCP).

Every rank writes its own shards of the weights, the AdamW state and the KL anchor (no rank
gathers the model), into `sharded/` of a staging directory; rank 0 adds the trainer's state
(`trainer.json`), the model's config and the tokenizer, then renames the staging directory
into place, as `checkpoint.save` does: a checkpoint is whole or absent, and a trainer killed
while writing resumes from the previous one. DCP records each tensor's global shape and
every shard's offsets, so a job resumes on any number of ranks (`load` reads, on each rank,
the pieces of its new shards), and `polyrl export` rebuilds the whole model in one process.

The directory must be one every rank sees (one pod's ranks, or a claim all trainer pods
mount). By default saving is synchronous: the next step waits for it (`checkpointEvery` sets
how often). With `checkpoint.asyncWrites` (`Writer`) each rank copies its shards to host
memory at once and DCP writes them on a thread of its own while training goes on, over a gloo
group of their own; rank 0 swaps the checkpoint into place as soon as the last file and the
metadata are written. One checkpoint is in flight at a time: the next save, and the
trainer's end, wait for it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from polyrl.workers.trainer import checkpoint

log = logging.getLogger("polyrl.trainer")
SHARDS = "sharded"  # DCP's files: `.metadata` and one `__<rank>_0.distcp` per rank


def holds_shards(directory: Path) -> bool:
    return (directory / SHARDS / ".metadata").is_file()


class Writer:
    """A sharded trainer's checkpoints, written in the step (`background` False: `save`) or
    beside the next steps (True: DCP's `async_save`), one in flight at a time. Made on every
    rank at once (the background writes' gloo group is collective)."""

    def __init__(self, *, background: bool) -> None:
        self.background = background
        self.group = dist.new_group(backend="gloo") if background else None
        self.pending: Future[Any] | None = None
        self.landed: Callable[[], None] | None = None  # rank 0: swaps the pending one in

    def save(
        self,
        directory: Path,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: checkpoint.TrainerState,
        *,
        rank: int,
        tokenizer: Any = None,
        reference: torch.nn.Module | None = None,
    ) -> float:
        """Every rank: this checkpoint's shards (after the one in flight has landed).
        Seconds the step waited: the whole save, or in the background the copy to host."""
        self.wait()
        started = time.monotonic()
        staging = _staging(directory, rank)
        if not self.background:  # every rank writes, then rank 0 swaps the whole in
            dcp_save(_payload(model, optimizer, reference), checkpoint_id=staging / SHARDS)
            if rank == 0:
                _swap_in(staging, directory, model, tokenizer, state)
            dist.barrier()
            return time.monotonic() - started
        response = dcp_async_save(
            _payload(model, optimizer, reference),
            checkpoint_id=staging / SHARDS,
            process_group=self.group,
        )
        future = response if isinstance(response, Future) else response.upload_completion
        if rank == 0:  # as soon as the last file and the metadata are written
            self.landed = _once(staging, directory, model, tokenizer, replace(state))
            future.add_done_callback(self._landed)
        self.pending = future
        return time.monotonic() - started

    def wait(self) -> None:
        """Every rank: the checkpoint in flight written, and swapped into place."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        pending.result()  # a write that failed raises here
        self._land()
        dist.barrier()  # every rank's, before anything of the next one is written

    def _landed(self, done: Future[Any]) -> None:
        if done.exception() is None:  # a failed write is raised by `wait`
            self._land()

    def _land(self) -> None:
        if self.landed is not None:
            self.landed()


def _once(
    staging: Path, directory: Path, model: Any, tokenizer: Any, state: checkpoint.TrainerState
) -> Callable[[], None]:
    """`_swap_in` of these, run once whichever thread asks first (the writer's, or the
    trainer's waiting for it)."""
    lock, done = threading.Lock(), [False]

    def land() -> None:
        with lock:
            if not done[0]:
                _swap_in(staging, directory, model, tokenizer, state)
                done[0] = True
                log.info("sharded checkpoint at step %d written in the background", state.step)

    return land


def _staging(directory: Path, rank: int) -> Path:
    """An empty staging directory beside `directory`, once every rank knows it is."""
    staging = directory.with_name(f".{directory.name}.staging")
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)  # a save killed before its rename
        staging.mkdir(parents=True)
    dist.barrier()
    return staging


def _swap_in(
    staging: Path, directory: Path, model: Any, tokenizer: Any, state: checkpoint.TrainerState
) -> None:
    """Rank 0, once every rank's shards are written: the rest, then the rename into place."""
    config = getattr(model, "config", None)
    if config is not None:
        config.save_pretrained(staging)
    if tokenizer is not None:
        tokenizer.save_pretrained(staging)
    (staging / checkpoint.STATE).write_text(json.dumps(asdict(state)))
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        os.replace(directory, old)
    os.replace(staging, directory)
    shutil.rmtree(old, ignore_errors=True)


def load(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    reference: torch.nn.Module | None = None,
) -> float:
    """Every rank, once the model is sharded: read this rank's shards of the checkpoint,
    whatever the number of ranks that wrote it. Seconds it took."""
    started = time.monotonic()
    payload = _payload(model, optimizer, reference)
    dcp_load(payload, checkpoint_id=directory / SHARDS)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=payload["model"],
        optim_state_dict=payload["optimizer"],
    )
    if reference is not None:
        set_model_state_dict(reference, payload["reference"])
    return time.monotonic() - started


def _payload(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, reference: torch.nn.Module | None
) -> dict[str, Any]:
    weights, moments = get_state_dict(model, optimizer)
    payload: dict[str, Any] = {"model": weights, "optimizer": moments}
    if reference is not None:
        payload["reference"] = get_model_state_dict(reference)
    return payload


def whole_weights(directory: Path, model: torch.nn.Module) -> None:
    """Load a sharded checkpoint's weights into an unsharded `model`, in one process
    (`polyrl export`): DCP assembles each tensor from every rank's file."""
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # torch warns that one process is what we asked for
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(state, checkpoint_id=directory / SHARDS, no_dist=True)
    model.load_state_dict(state["model"])
