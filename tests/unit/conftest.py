"""Unit tests are quick: each gets 10 s (setup and teardown included), where the rest of the
suite has the global 600 s, so that one that grew slow fails here instead of slowing every
run. A unit test starts no process (no subprocess, nats-server or torchrun: those tests live
under tests/integration) and builds no model over about a million parameters. The few that
must stay here and take longer are marked `slow` and keep the global limit, as do the engine
contract's `vllm` cases: they run apart (`make test-vllm-contract`, in vLLM's own venv) and
building a vLLM engine on CPU takes longer than any unit test may.
"""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent
SECONDS = 10


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Called with every item of the session, not only this directory's.
    for item in items:
        if item.path.is_relative_to(UNIT) and not _exempt(item):
            item.add_marker(pytest.mark.timeout(SECONDS))


def _exempt(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in ("slow", "vllm"))
