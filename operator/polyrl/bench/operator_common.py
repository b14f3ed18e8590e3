"""Constants and the progress line shared by the operator benchmark's modules."""

from __future__ import annotations

import sys
import time

from polyrl.operator.settings import OperatorSettings

NAMESPACE = "polyrl-bench"
POLICIES = ("solver", "verifier")
SCALE_STEP = 10
WATCH_SECONDS = 1  # each pod watch request is this short, so the watch stops promptly
STATUS_INTERVAL = OperatorSettings().status_interval  # the operator's default
API_REQUESTS = "polyrl_operator_api_requests_total"
RECONCILES = "polyrl_operator_reconciles_total"


def say(message: str) -> None:
    """A progress line on stderr (stdout carries the JSON)."""
    print(f"[bench operator {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
