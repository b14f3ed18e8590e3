"""The workflow interface's old import paths work for one release, saying where it moved."""

from __future__ import annotations

import importlib
import sys

import pytest

from polyrl.workers.workflows import episode as episode_module
from polyrl.workers.workflows import interface


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ("polyrl.workers.roles", interface, ["PolicyRole", "TaskAccuracy", "load_workflow"]),
        ("polyrl.workers.episode", episode_module, ["Episode"]),
    ],
)
def test_an_old_import_path_warns_naming_the_new_one_and_gives_the_same_objects(
    old: str, new: object, names: list[str]
) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new.__name__}"):  # type: ignore[attr-defined]
        module = importlib.import_module(old)
    for name in names:
        assert getattr(module, name) is getattr(new, name)
