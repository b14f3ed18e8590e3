"""Tasks: generated problems with exact rewards (`arithmetic`, `countdown`, or a user's own).

Call sites use the modules (`base.Problem`, `loading.load_task`, `verify.parse_verdict`); the
names below are re-exported for the workflow runner, which needs little else.
"""

from polyrl.workers.tasks.base import Problem, Task
from polyrl.workers.tasks.loading import load_task
from polyrl.workers.tasks.verify import parse_verdict, verify_answer, verify_prompt

__all__ = ["Problem", "Task", "load_task", "parse_verdict", "verify_answer", "verify_prompt"]
