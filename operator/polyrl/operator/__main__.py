"""python -m polyrl.operator: the same as `polyrl operator`."""

import sys

from polyrl.operator import run

sys.exit(run.main())
