"""How a worker says why it stops: stderr, its termination message and its exit status."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyrl.api.launch import EXIT_INVALID_INPUT, EXIT_UNAVAILABLE, TERMINATION_LOG_ENV
from polyrl.workers import errors
from polyrl.workers.runtime import worker as runtime


def test_a_refused_input_exits_2_and_says_so_in_the_termination_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "termination"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(log))
    code = runtime.fail("polyrl worker", errors.ConfigError("unknown task 'nosuchtask'"))
    assert code == EXIT_INVALID_INPUT
    assert log.read_text() == "invalid input: unknown task 'nosuchtask'\n"
    assert "polyrl worker: invalid input: unknown task 'nosuchtask'" in capsys.readouterr().err


def test_a_missing_dependency_exits_69_without_the_invalid_input_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination"
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(log))
    code = runtime.fail("polyrl trainer", errors.Unavailable("cannot reach NATS"))
    assert code == EXIT_UNAVAILABLE
    assert log.read_text() == "cannot reach NATS\n"


def test_without_a_writable_termination_log_the_worker_still_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TERMINATION_LOG_ENV, "/nonexistent/dir/termination")
    assert runtime.fail("w", errors.ConfigError("x")) == EXIT_INVALID_INPUT
