"""Namespaces for the operator's tests; the operator itself is a session fixture in
`tests/conftest.py` (shared with the end-to-end tests, see `tests/operator_stack.py`).

RBAC comes from the Helm chart itself (ServiceAccount, ClusterRole, binding, peering), so a
verb missing from the chart fails a test here. Worker pods run the FAKE worker
(`tests/fakes/fake_worker.py`) in namespaces whose pods the node agent executes, except
where a test asks for the real rollout workers; elsewhere pods are only marked Running.
Test namespaces enforce Pod Security `restricted`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.operator_stack import (
    FAKE_WORKERS,
    REAL_ROLLOUTS,
    restricted_namespace,
)

from polyrl.testing.kube import Kubectl
from polyrl.testing.operatorprocess import OperatorProcess

__all__ = ["OperatorProcess"]


@pytest.fixture
def ns(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    """A restricted namespace whose pods are only marked Running."""
    yield from restricted_namespace(kubectl, "status")


@pytest.fixture
def exec_ns(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    """A restricted namespace whose pods run (the fake worker) as local processes."""
    operator.use(FAKE_WORKERS)
    yield from restricted_namespace(kubectl, "exec")


@pytest.fixture
def real_rollouts_ns(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[str]:
    """A restricted namespace whose rollout and workflow pods run the real workers
    (`polyrl worker ...`) as local processes; the trainer is still the fake, so the test
    publishes the model bundle and weights itself."""
    operator.use(REAL_ROLLOUTS)
    yield from restricted_namespace(kubectl, "exec")
