"""Tasks: generated problems with exact rewards (`arithmetic`, `countdown`, or a user's own).

Call sites use the modules (`base.Problem`, `loading.load_task`, `verify.parse_verdict`); the
names below are re-exported for the workers, which need little else.
"""

from polyrl.workers.tasks.base import Problem, Task
from polyrl.workers.tasks.loading import load_task

__all__ = ["Problem", "Task", "load_task"]
