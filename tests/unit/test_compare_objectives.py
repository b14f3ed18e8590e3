"""scripts/compare_objectives.py: the job it runs per objective and seed, and what it reads
back from a run's metrics.jsonl."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import yaml

from polyrl.api.resources import RLJob

REPO = Path(__file__).resolve().parents[2]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare", REPO / "scripts/compare_objectives.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_run_is_the_job_with_its_objective_seed_steps_and_lora() -> None:
    compare = script()
    doc = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    args = argparse.Namespace(steps=30, lora=16, lr=3e-4)
    job = RLJob.model_validate(compare.job_for(doc, "m2po", 1, args))
    assert job.metadata.name == "quickstart-m2po-s1"
    assert job.spec.algorithm.loss.name == "m2po"
    assert job.spec.workflow.task.seed == 1
    assert job.spec.stop.steps == 30
    assert all(p.trainer.steps is None for p in job.spec.policies)
    assert all(p.trainer.lora is not None and p.trainer.lora.rank == 16 for p in job.spec.policies)
    assert all(p.trainer.optimizer.lr == 3e-4 for p in job.spec.policies)
    assert "loss" not in doc["spec"]["algorithm"]  # the shipped job is left as it is


def test_a_runs_figures_are_read_per_policy_from_its_metrics(tmp_path: Path) -> None:
    compare = script()
    records = [
        {"policy": "solver", "step": 0, "held_out": 0.40},
        {"policy": "solver", "step": 1, "step_seconds": 2.0, "is_deviation": 0.1,
         "clip_frac": 0.02, "is_m2": 0.01},
        {"policy": "solver", "step": 2, "step_seconds": 4.0, "is_deviation": 0.3,
         "clip_frac": 0.04, "is_m2": 0.03, "held_out": 0.55},
        {"stage": "warming up"},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    got = compare.summarise(tmp_path)["solver"]
    assert got["held_out"] == {0: 0.40, 2: 0.55}
    assert got["step_seconds"] == 3.0
    assert (got["is_deviation"], got["clip_frac"], got["is_m2"]) == (0.2, 0.03, 0.02)
    table = compare.table({"grpo-s0": {"wall_seconds": 120.0, "policies": {"solver": got}}})
    assert (
        "| grpo | 0 | solver | 0.400 → 0.550 (0.550) | 3.0 | 0.2 | 3.00 % | 0.02 | 2.0 min |"
        in table
    )
