"""`polyrl export`: a trainer checkpoint becomes an HF directory that transformers loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from polyrl import cli
from polyrl.api.resources import ModelSource
from polyrl.workers.models import loading as models
from polyrl.workers.trainer import checkpoint


def write_checkpoint(directory: Path, name: str, *, step: int = 3) -> torch.nn.Module:
    source = ModelSource.model_validate({"path": f"tiny-llama://{name}", "dtype": "float32"})
    model, tokenizer = models.make_model(source, cache_dir=directory.parent / "models")
    with torch.no_grad():  # a "trained" model: not the initial weights any more
        next(model.parameters()).add_(0.25)
    optimizer = torch.optim.AdamW(model.parameters())
    state = checkpoint.TrainerState(step=step, version=step)
    checkpoint.save(directory, model, optimizer, state, tokenizer=tokenizer)
    return model


def test_an_exported_checkpoint_loads_with_transformers_with_the_trained_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trained = write_checkpoint(tmp_path / "ckpt", "export-a")
    out = tmp_path / "exported"
    assert cli.main(["export", str(tmp_path / "ckpt"), str(out), "--dtype", "float32"]) == 0
    assert "exported" in capsys.readouterr().out
    assert not (out / checkpoint.OPTIMIZER).exists()  # no optimizer state in an export
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tokenizer.decode(tokenizer("12+35=")["input_ids"], skip_special_tokens=True) == "12+35="


def test_export_defaults_to_bfloat16_and_finds_a_policy_in_a_run_directory(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    trained = write_checkpoint(run / "trainers/default/job/solver/checkpoint", "export-b")
    write_checkpoint(run / "trainers/default/job/verifier/checkpoint", "export-c")
    out = tmp_path / "solver-hf"
    assert cli.main(["export", str(run), str(out), "--policy", "solver"]) == 0
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    weight = "model.embed_tokens.weight"
    assert loaded.state_dict()[weight].dtype == torch.bfloat16
    assert torch.equal(loaded.state_dict()[weight], trained.state_dict()[weight].to(torch.bfloat16))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{run}", "{out}"], "several policies, pick one with --policy"),
        (["{run}", "{out}", "--policy", "critic"], "no checkpoint of policy 'critic'"),
        (["{empty}", "{out}"], "no trainer checkpoint in it"),
        (["{missing}", "{out}"], "no such directory"),
        (["{run}", "{existing}", "--policy", "solver"], "already exists"),
        (["{run}", "{out}", "--policy", "solver", "--adapter"], "--adapter needs a LoRA policy"),
        (
            ["nats://127.0.0.1:9/ns/job", "{out}", "--policy", "solver", "--adapter"],
            "a job's NATS holds the merged weights",
        ),
    ],
)
def test_export_refuses_what_it_cannot_do_with_exit_2_and_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    run = tmp_path / "run"
    for policy in ("solver", "verifier"):
        write_checkpoint(run / f"trainers/default/job/{policy}/checkpoint", f"export-{policy}")
    paths = {
        "run": run,
        "out": tmp_path / "out",
        "empty": tmp_path / "empty",
        "missing": tmp_path / "missing",
        "existing": tmp_path / "existing",
    }
    paths["empty"].mkdir()
    paths["existing"].mkdir()
    argv = ["export", *(a.format(**{k: str(v) for k, v in paths.items()}) for a in args)]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not paths["out"].exists()
