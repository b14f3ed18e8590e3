"""Why a worker stops: the errors its entry point turns into an exit status and a
termination message (`runtime.fail`)."""

from __future__ import annotations


class ConfigError(RuntimeError):
    """The job's spec or inputs cannot work (an unknown workflow or task, a model path that is
    not a model): starting the worker again cannot help."""


class Unavailable(RuntimeError):
    """Something the worker needs is not there yet (NATS): worth another try later."""


class StorageFull(Unavailable):
    """A stream or bucket is at its limit (`natsconfig`): the worker stops and says which and
    why, so that the job shows it in a condition instead of hanging; a later try may pass
    once a consumer catches up."""


class Stopped(Exception):
    """Asked to stop (SIGTERM) before it could start its work: not a failure."""
