"""Deprecated: the workflow interface moved to `polyrl.workers.workflows.interface`.

`from polyrl.workers.roles import PolicyRole` (and the other names) keeps working for one
release, with a DeprecationWarning naming the new path; import from
`polyrl.workers.workflows` (or `polyrl.workers.workflows.interface`) instead.
"""

from __future__ import annotations

import warnings

from polyrl.workers.workflows.interface import *  # noqa: F403
from polyrl.workers.workflows.interface import __all__  # noqa: F401

warnings.warn(
    "polyrl.workers.roles moved to polyrl.workers.workflows.interface "
    "(import PolicyRole, TaskAccuracy, ... from polyrl.workers.workflows)",
    DeprecationWarning,
    stacklevel=2,
)
