"""One reconcile pass over an RLJob: the state its parts (`jobnats`, `runners`, `jobstatus`,
`jobphase`) share, so that each can take it without importing the orchestration (`jobs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polyrl.api.resources import RLJob, RLJobStatus
from polyrl.operator import report
from polyrl.operator.context import Context


@dataclass
class JobReconcile(report.Recorder):
    """The state of one reconcile pass over a job."""

    ctx: Context
    body: Mapping[str, Any]
    job: RLJob
    status: RLJobStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def ns(self) -> str:
        return self.job.metadata.namespace

    @property
    def name(self) -> str:
        return self.job.metadata.name

    @property
    def generation(self) -> int:
        return self.job.metadata.generation
