"""Metrics as TensorBoard event files, written by hand and read back by TensorBoard itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyrl.workers.runtime import tensorboard
from polyrl.workers.runtime.worker import MetricsLog


def test_crc32c_matches_the_standard_check_value() -> None:
    assert tensorboard.crc32c(b"123456789") == 0xE3069283  # RFC 3720's check value


def test_the_metrics_log_writes_event_files_that_tensorboard_reads(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing import event_accumulator as accumulator

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write([{"policy": "solver", "step": 1, "reward": 0.25, "loss": -1.5, "done": True}])
    log.write([{"policy": "solver", "step": 2, "reward": 0.5, "note": "text"}])
    log.write([{"policy": "solver", "elapsed": 3.0}])  # no step: metrics.jsonl only
    log.stage("solver", "training")  # stages are not figures
    files = list((tmp_path / "tensorboard").iterdir())
    assert len(files) == 1
    assert files[0].name.startswith("events.out.tfevents.")
    events = accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["solver/loss", "solver/reward"]
    rewards = [(e.step, e.value) for e in events.Scalars("solver/reward")]
    assert rewards == [(1, 0.25), (2, 0.5)]
    assert [e.value for e in events.Scalars("solver/loss")] == [-1.5]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_without_a_metrics_file_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    MetricsLog(None).write([{"policy": "p", "step": 1, "reward": 1.0}])
    assert list(tmp_path.iterdir()) == []
