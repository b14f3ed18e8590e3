"""TensorBoard event files beside metrics.jsonl, written without TensorBoard installed.

TensorBoard is the usual tool for looking at training curves, and it reads a directory of
event files offline (`tensorboard --logdir RUN_DIR/tensorboard`). A worker does not need
TensorBoard or protobuf to write them: an event file is a TFRecord stream (per record: the
length as little-endian uint64, its masked CRC-32C, the bytes, their masked CRC-32C) of
`tensorflow.Event` protocol buffers, and the few fields scalars need are encoded here by
hand: `wall_time` (1, double), `step` (2, int64), `file_version` (3, the first record) and
`summary` (5) holding `value`s (1) of `tag` (1) and `simple_value` (2, float).

Each process writes its own file (TensorBoard merges every file of a directory); a record's
numeric fields become scalars tagged `<policy>/<field>` (or `<role>/<field>`), at the record's
`step` (records without one are left to metrics.jsonl).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DIRECTORY = "tensorboard"
_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_TABLE = []
for _byte in range(256):
    _crc = _byte
    for _ in range(8):
        _crc = (_crc >> 1) ^ _POLY if _crc & 1 else _crc >> 1
    _TABLE.append(_crc)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return (
        length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def event(*, wall_time: float, step: int = 0, scalars: Mapping[str, float] | None = None,
          file_version: str | None = None) -> bytes:  # fmt: skip
    """A serialised `Event` with a file version or a summary of scalars."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", v))
            for tag, v in scalars.items()
        )
        out += _bytes_field(5, values)
    return out


class EventWriter:
    """Appends scalars to this process's event file in `directory`, created on first use."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path: Path | None = None

    def _open(self) -> Path:
        if self.path is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            now = time.time()
            name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}"
            self.path = self.directory / name
            with self.path.open("ab") as out:
                out.write(record(event(wall_time=now, file_version="brain.Event:2")))
        return self.path

    def write(self, records: list[dict[str, Any]]) -> None:
        """Each record with a `step`: its numeric fields as scalars under its policy or role."""
        events = []
        for rec in records:
            step, scalars = scalars_of(rec)
            if step is not None and scalars:
                events.append(record(event(wall_time=time.time(), step=step, scalars=scalars)))
        if events:
            with self._open().open("ab") as out:
                out.writelines(events)


def scalars_of(rec: Mapping[str, Any]) -> tuple[int | None, dict[str, float]]:
    """(step, {tag: value}) of a metrics record; step None when it has none."""
    step = rec.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None, {}
    prefix = str(rec.get("policy") or rec.get("role") or "run")
    scalars = {
        f"{prefix}/{key}": float(value)
        for key, value in rec.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }
    return step, scalars
