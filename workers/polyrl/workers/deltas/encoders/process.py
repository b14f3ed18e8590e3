"""The encoder that runs the codec in a child process, on snapshots in shared memory.

The child is started (spawn: a fresh interpreter, with none of the trainer's threads or CUDA
state) when the encoder is made, so its imports overlap the trainer's warm-up. At the first
snapshot the encoder lays the state out in two slots of shared memory, each one flat buffer, and
hands both to the child once (torch passes their file descriptors: two, whatever the number of
tensors). From then on a snapshot is a copy into the slot that is not the published one, and a
request names slots by index, so the only bytes that cross the pipe are the encoded objects
coming back.

Shared memory is /dev/shm, a tmpfs that containers cap (64 MiB in Docker, and in a pod unless a
memory-backed emptyDir is mounted there, as the operator does for trainers). Writing past the cap
kills the writer with SIGBUS, so when two slots do not fit in what /dev/shm has free, the encoder
logs why and encodes in the trainer instead. It does the same, once, if the child dies: the slots
are the trainer's memory too, so nothing is lost but the speed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from polyrl.workers.deltas import encode
from polyrl.workers.deltas.encoders import Snapshot, StateDict
from polyrl.workers.deltas.encoders.inline import InlineEncoder

log = logging.getLogger(__name__)

SHM = Path("/dev/shm")
SLOTS = 2  # the published snapshot and the one being made
SHM_USE = 0.9  # of /dev/shm's free space, at most, for the slots
ALIGN = 64  # bytes; every tensor in a slot starts on a cache line
STOP_PATIENCE = 5.0  # seconds for the child to exit once asked

Layout = list[tuple[str, torch.dtype, tuple[int, ...], int]]  # name, dtype, shape, byte offset


class EncoderDied(RuntimeError):
    """The child process exited or its pipe broke."""


class ProcessEncoder:
    """An `Encoder` whose keyframes and deltas are made by a child process (see the module doc).

    `workers` is the codec's thread count in the child (None: the trainer's torch thread count,
    as the codec would use in the trainer). The child is spawned, so it imports the parent's
    main module: a script that makes one must guard its entry point with
    `if __name__ == "__main__":`, as for any spawned process (the trainer's is `-m`, guarded).
    Unguarded, the child runs the script instead of serving, and encoding falls back to the
    trainer with the error logged.
    """

    def __init__(self, *, workers: int | None = None) -> None:
        self._inline = InlineEncoder(workers)
        self._lock = threading.Lock()
        self._slots: list[Snapshot] = []
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process: Any = context.Process(
            target=serve,
            args=(child, workers, torch.get_num_threads()),
            name="polyrl-delta-encoder",
            daemon=True,
        )
        try:
            self._process.start()
        except OSError as err:
            log.warning("delta encoding stays in the trainer: no encoder process (%s)", err)
            self._process = None
            self._conn.close()
        finally:
            child.close()

    @property
    def pid(self) -> int | None:
        """The child's process id while it encodes; None once encoding is inline."""
        return None if self._process is None else int(self._process.pid)

    def snapshot(self, state: StateDict, *, keep: Snapshot | None) -> Snapshot:
        if not self._slots:
            self._slots = self._allocate(state)
        slot = next(s for s in self._slots if s is not keep)
        if slot.keys() != state.keys():
            raise ValueError("the state names other tensors than the first one published")
        for name, tensor in state.items():
            slot[name].copy_(tensor.detach())  # raises on another shape
        return slot

    def keyframe(self, state: Snapshot, *, version: int) -> bytes:
        request = ("keyframe", self._index(state), version)
        blob: bytes = self._encode(request, lambda: self._inline.keyframe(state, version=version))
        return blob

    def delta(self, old: Snapshot, new: Snapshot, *, base_version: int, new_version: int) -> bytes:
        request = ("delta", self._index(old), self._index(new), base_version, new_version)
        blob: bytes = self._encode(
            request,
            lambda: self._inline.delta(
                old, new, base_version=base_version, new_version=new_version
            ),
        )
        return blob

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        # Under the lock, so the stop cannot interleave with a request another thread is
        # sending; an encode that holds it too long is cut short by terminate below.
        if self._lock.acquire(timeout=STOP_PATIENCE):
            try:
                with contextlib.suppress(OSError):  # already gone
                    self._conn.send(None)
            finally:
                self._lock.release()
        process.join(STOP_PATIENCE)
        if process.is_alive():
            process.terminate()
            process.join()
        self._conn.close()

    def _allocate(self, state: StateDict) -> list[Snapshot]:
        layout, size = plan_layout(state)
        room = shm_free()
        if self._process is not None and SLOTS * size > SHM_USE * room:
            log.warning(
                "delta encoding stays in the trainer: two %d MB snapshots need more than the "
                "%d MB free in %s (mount a larger memory-backed volume there)",
                size // 10**6,
                room // 10**6,
                SHM,
            )
            self.close()
        flats = [torch.empty(size, dtype=torch.uint8) for _ in range(SLOTS)]
        if self._process is not None:
            flats = [flat.share_memory_() for flat in flats]  # type: ignore[no-untyped-call]
            self._encode(("slots", flats, layout), lambda: None)
        return [views(flat, layout) for flat in flats]

    def _index(self, state: Snapshot) -> int:
        for index, slot in enumerate(self._slots):
            if slot is state:
                return index
        raise ValueError("not a snapshot of this encoder")

    def _encode(self, request: tuple[Any, ...], inline: Callable[[], Any]) -> Any:
        if self._process is not None:
            try:
                return self._call(request)
            except EncoderDied as err:
                log.error("%s; encoding in the trainer from now on", err)
                self.close()
        return inline()

    def _call(self, request: tuple[Any, ...]) -> Any:
        """Send `request`; its reply is a status and, for an encode, the blob as raw bytes.

        The blob goes by `send_bytes` and not pickled with the status: a keyframe is the size of
        the model, and pickling would copy it once more on each side.
        """
        process = self._process
        with self._lock:
            try:
                self._conn.send(request)
                status, value = self._conn.recv()
                blob = self._conn.recv_bytes() if status == "blob" else None
            except (EOFError, OSError) as err:
                raise EncoderDied(
                    f"the delta encoder process (pid {process.pid}) is gone "
                    f"(exit code {process.exitcode})"
                ) from err
        if status == "error":
            raise RuntimeError(f"delta encoder process: {value}")
        return blob


def plan_layout(state: StateDict) -> tuple[Layout, int]:
    """Where each tensor lives in a flat slot, and the slot's size in bytes."""
    layout: Layout = []
    offset = 0
    for name, tensor in state.items():
        layout.append((name, tensor.dtype, tuple(tensor.shape), offset))
        offset += math.ceil(tensor.numel() * tensor.element_size() / ALIGN) * ALIGN
    return layout, max(offset, ALIGN)


def views(flat: torch.Tensor, layout: Layout) -> Snapshot:
    """The slot's tensors: views of `flat`, by `layout`."""
    out: Snapshot = {}
    for name, dtype, shape, offset in layout:
        nbytes = math.prod(shape) * dtype.itemsize
        out[name] = flat[offset : offset + nbytes].view(dtype).view(shape)
    return out


def shm_free() -> int:
    """Bytes free in /dev/shm; unbounded where there is none (torch then uses other means)."""
    if not SHM.is_dir():
        return 1 << 62
    stat = os.statvfs(SHM)
    return stat.f_bavail * stat.f_frsize


def serve(conn: Connection, workers: int | None, threads: int) -> None:
    """The child: answer requests until the pipe closes or a None arrives."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the trainer, which stops us
    torch.set_num_threads(threads)
    slots: list[Snapshot] = []
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        try:
            blob = _handle(request, slots, workers)
        except Exception as err:  # the trainer raises it; the child keeps serving
            conn.send(("error", f"{type(err).__name__}: {err}"))
            continue
        if blob is None:
            conn.send(("ok", None))
        else:
            conn.send(("blob", len(blob)))
            conn.send_bytes(blob)


def _handle(request: tuple[Any, ...], slots: list[Snapshot], workers: int | None) -> bytes | None:
    match request:
        case ("slots", flats, layout):
            slots[:] = [views(flat, layout) for flat in flats]
            return None
        case ("keyframe", index, version):
            return encode.encode_keyframe(slots[index], version=version, workers=workers)
        case ("delta", old, new, base_version, new_version):
            return encode.encode_delta(
                slots[old],
                slots[new],
                base_version=base_version,
                new_version=new_version,
                workers=workers,
            )
    raise ValueError(f"unknown request {request[0]!r}")
