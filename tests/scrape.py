"""Reading a worker's Prometheus metrics as Prometheus would: its text format, its parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def worker_metrics(url: str) -> dict[str, float]:
    """Every `polyrl_worker_*` sample at `url` (…/metrics), by name."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("polyrl_worker_")
    }
