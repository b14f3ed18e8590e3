"""`polyrl bench tls --quick` runs end to end and reports both sides and their ratios."""

from __future__ import annotations

import asyncio

import pytest

from polyrl.bench import tls as bench


@pytest.mark.slow
async def test_the_quick_tls_benchmark_measures_both_servers_and_their_ratios() -> None:
    figures = await asyncio.to_thread(bench.run, quick=True)
    for side in ("plain", "tls"):
        assert 0 < figures[f"{side}_connect_s"] < 5, figures
        assert figures[f"{side}_msgs_per_s"] > 0, figures
    # The handshake costs something; the ratios are measured, not assumed.
    assert figures["connect_tls_over_plain"] > 0
    assert 0 < figures["rate_tls_over_plain"] < 10
    assert figures["quick"] is True
