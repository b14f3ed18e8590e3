"""End-to-end fixtures: namespaces where the operator's pods run the real workers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.operator_stack import restricted_namespace

from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import REAL_WORKERS, OperatorProcess


@pytest.fixture
def real_ns(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    """A restricted namespace whose pods the node agent runs with the real workers: rollout
    and workflow pods `polyrl worker ...`, trainers under torchrun."""
    operator.use(REAL_WORKERS)
    names = restricted_namespace(kubectl, "exec")
    namespace = next(names)
    yield namespace
    next(names, None)  # deletes the job and the namespace
