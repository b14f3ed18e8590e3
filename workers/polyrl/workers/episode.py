"""Deprecated: `Episode` moved to `polyrl.workers.workflows.episode`.

`from polyrl.workers.episode import Episode` keeps working for one release, with a
DeprecationWarning naming the new path; import it from `polyrl.workers.workflows` instead.
"""

from __future__ import annotations

import warnings

from polyrl.workers.workflows.episode import *  # noqa: F403
from polyrl.workers.workflows.episode import __all__  # noqa: F401

warnings.warn(
    "polyrl.workers.episode moved to polyrl.workers.workflows.episode "
    "(import Episode from polyrl.workers.workflows)",
    DeprecationWarning,
    stacklevel=2,
)
