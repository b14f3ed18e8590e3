"""Why an episode is dropped: an exception that carries a reason the runner counts by.

A workflow raises (or lets through) an `EpisodeDropped` when an episode cannot go on and none
of its samples should reach a trainer: a tool that failed (`tool`), an environment that
failed (`environment`), a conversation past its limits (`turns`, `context`). The runner
drops the whole episode, so no group is sent with some of its samples missing, counts it by
reason (and policy, where the exception names one), logs it and goes on with the next.
"""

from __future__ import annotations


class EpisodeDropped(Exception):
    """An episode that ends without samples, for `reason` (counted)."""

    reason = "dropped"

    def __init__(
        self, message: str, *, reason: str | None = None, policy: str | None = None
    ) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        self.policy = policy


__all__ = ["EpisodeDropped"]
