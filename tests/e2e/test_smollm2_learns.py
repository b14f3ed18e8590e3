"""A real pretrained model learns in polyrl: SmolLM2-135M-Instruct on sums, under `polyrl run`.

Three runs of `examples/smollm2-arithmetic.yaml` (the GGUF file `make smollm2` fetches): the
job as shipped (task seed 0), the same with task seed 1 (other training problems in another
order, another held-out split), and seed 0 with `algorithm.shuffleRewards: true` (rewards
permuted within each batch: no completion is rewarded for being right). The claims, at the
job's last step (10), not in wall time, which varies with the machine's load:

* greedy accuracy on the 200 held-out problems, answered by the policy's own rollout pool,
  rises at least 15 points from step 0 in each rewarded run;
* the shuffled control rises at most 3 points.

Each run's wall time, steps and step-time breakdown (waiting for generation, training,
evaluation, weight publication) are printed, whatever the outcome. About 30 minutes on a
2-core machine. The file's second test runs `examples/smollm2-solver-verifier.yaml`, two
SmolLM2 policies together (about 17 minutes), its third the same two as LoRA adapters on
one shared rollout pool (`examples/smollm2-solver-verifier-lora.yaml`), its fourth a frozen
SmolLM2 judging a SmolLM2 solver (`examples/smollm2-judge.yaml`), then the multi-turn examples
with SmolLM2: the calculator tool (`examples/smollm2-calculator.yaml`) and a verifier's
critique as the solver's next turn (`examples/smollm2-critique.yaml`), and SmolLM2 trained
sharded over two ranks (`examples/smollm2-sharded.yaml`). All:
`make test-learning-smollm2`, never part of `make test`.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests import documented

from polyrl.workers.models import catalog

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.learning_smollm2]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2-arithmetic.yaml"
TWO_POLICIES = EXAMPLE.with_name("smollm2-solver-verifier.yaml")
TWO_ADAPTERS = EXAMPLE.with_name("smollm2-solver-verifier-lora.yaml")
JUDGED = EXAMPLE.with_name("smollm2-judge.yaml")
CALCULATOR = EXAMPLE.with_name("smollm2-calculator.yaml")
CRITIQUE = EXAMPLE.with_name("smollm2-critique.yaml")
SHARDED = EXAMPLE.with_name("smollm2-sharded.yaml")
GAIN = 0.15
CONTROL_GAIN = 0.03
RUN_SECONDS = 30 * 60  # one run's ceiling: three times a quiet machine's, for loaded ones


def run(
    tmp_path: Path, example: Path, *, edit: Callable[[dict[str, Any]], None] | None = None
) -> tuple[list[dict[str, Any]], float]:
    """The metric records of one run of `example`, and its wall time. Without `edit` it is
    the example's own header command, run as written (where the model is where the example
    says); with `edit` a copy of the job, changed by it, runs on the fetched file."""
    doc = yaml.safe_load(example.read_text())
    model = catalog.target(catalog.lookup("smollm2-135m-instruct"))
    if not model.exists():
        pytest.fail(f"{model} is missing: fetch it with `make smollm2`")
    tmp_path.mkdir(parents=True)
    paths = {Path(p["model"]["path"]).expanduser() for p in doc["spec"]["policies"]}
    if edit is None and paths == {model}:
        (tmp_path / "examples").symlink_to(example.parent)
        source = f"examples/{example.name}"
        command = next(
            c.text
            for c in documented.commands()
            if c.source == source and c.text.startswith("polyrl run")
        )
        argv, run_dir = ["bash", "-c", command], tmp_path / command.split("--run-dir ")[1]
    else:
        if edit is not None:
            edit(doc)
        for policy in doc["spec"]["policies"]:  # the file where `make smollm2` put it
            policy["model"]["path"] = str(model)  # ($POLYRL_CACHE may move it)
        job = tmp_path / "job.yaml"
        job.write_text(yaml.safe_dump(doc))
        run_dir = tmp_path / "run"
        argv = [sys.executable, "-m", "polyrl.cli", "run", str(job), "--run-dir", str(run_dir)]
    started = time.monotonic()
    # `polyrl` as the header writes it: this environment's.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env={**os.environ, "PATH": path},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the run stops its workers
        proc.communicate(timeout=120)
        raise
    seconds = time.monotonic() - started
    assert proc.returncode == 0, stderr[-3000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], seconds


def solver_run(tmp_path: Path, *, seed: int, shuffle: bool) -> tuple[list[dict[str, Any]], float]:
    """The solver's records of the arithmetic example, as written for seed 0 with rewards."""

    def changed(doc: dict[str, Any]) -> None:
        doc["spec"]["workflow"]["task"]["seed"] = seed
        doc["spec"]["algorithm"]["shuffleRewards"] = shuffle

    as_written = seed == 0 and not shuffle
    records, seconds = run(tmp_path, EXAMPLE, edit=None if as_written else changed)
    return [r for r in records if r.get("policy") == "solver"], seconds


def summary(name: str, records: list[dict[str, Any]], seconds: float) -> tuple[float, str]:
    """The run's greedy gain and a line that says it with the step-time breakdown."""
    evals = sorted((r["step"], r["accuracy"]) for r in records if "accuracy" in r)
    steps = [r for r in records if "train_seconds" in r]
    (first, start), (last, end) = evals[0], evals[-1]
    assert first == 0, "no step-0 evaluation"

    def median(key: str) -> float:
        return float(statistics.median(r.get(key, 0.0) for r in steps))

    line = (
        f"{name}: greedy {start:.3f} -> {end:.3f} ({end - start:+.3f}) at step {last}, "
        f"{len(steps)} steps in {seconds:.0f} s; per step (medians): waiting for samples "
        f"{median('wait_seconds'):.1f} s, then {median('step_seconds'):.1f} s of which training "
        f"{median('train_seconds'):.1f} s; publishing {median('publish_seconds'):.1f} s "
        f"(beside the next step); evaluations "
        + ", ".join(f"{r['eval_seconds']:.0f}" for r in records if "eval_seconds" in r)
        + " s"
    )
    return end - start, line


@pytest.mark.timeout(3 * RUN_SECONDS + 600)
def test_smollm2_learns_sums_from_rewards_for_two_seeds_and_not_from_shuffled_ones(
    tmp_path: Path,
) -> None:
    results = {
        "seed 0": solver_run(tmp_path / "seed0", seed=0, shuffle=False),
        "seed 1": solver_run(tmp_path / "seed1", seed=1, shuffle=False),
        "shuffled rewards": solver_run(tmp_path / "shuffled", seed=0, shuffle=True),
    }
    gains, lines = {}, []
    for name, (records, seconds) in results.items():
        gains[name], line = summary(name, records, seconds)
        lines.append(line)
    said = "\n".join(lines)
    print(said)
    assert gains["seed 0"] >= GAIN, said
    assert gains["seed 1"] >= GAIN, said
    assert gains["shuffled rewards"] <= CONTROL_GAIN, said


def figures(records: list[dict[str, Any]], policy: str, keys: tuple[str, ...]) -> str:
    """A policy's held-out figures at each evaluated step, as one line."""
    evals = [r for r in records if r.get("policy") == policy and keys[0] in r]
    return f"{policy}: " + "; ".join(
        f"step {r['step']}: " + ", ".join(f"{k} {r[k]:.3f}" for k in keys if k in r) for r in evals
    )


@pytest.mark.timeout(2 * RUN_SECONDS + 600)
def test_a_smollm2_solver_and_a_smollm2_verifier_train_20_steps_each_with_figures_at_both_ends(
    tmp_path: Path,
) -> None:
    """The solver-verifier example as written: two real policies, 20 steps each, both with
    held-out figures at step 0 and 20. No learning claim for the verifier; the solver's
    figure must not fall (it rose 35-53 points in 10 steps alone)."""
    records, seconds = run(tmp_path / "sv", TWO_POLICIES)
    both_trained(records, seconds)


@pytest.mark.timeout(2 * RUN_SECONDS + 600)
def test_the_smollm2_solver_and_verifier_train_as_adapters_on_one_shared_rollout_pool(
    tmp_path: Path,
) -> None:
    """The LoRA solver-verifier example as written: both policies LoRA adapters on the one
    base, served by the solver's pool alone (`rollout.servedBy`), 20 steps each with
    held-out figures at both ends; only adapters go to the pool after the base."""
    records, seconds = run(tmp_path / "svl", TWO_ADAPTERS)
    both_trained(records, seconds)
    logs = tmp_path / "svl" / "runs" / "smollm2-sv-lora" / "logs"
    rollouts = sorted(log.name for log in logs.glob("*-rollout-*.log"))
    assert len(rollouts) == 1, rollouts  # the solver's pool, serving both
    assert "serving verifier beside solver" in (logs / rollouts[0]).read_text()
    kinds = {r["published_kind"] for r in records if "published_kind" in r}
    assert kinds, "no published versions in metrics.jsonl"
    assert all(set(k.split("+")) <= {"adapter", "adapter-delta"} for k in kinds), kinds


def both_trained(records: list[dict[str, Any]], seconds: float) -> None:
    """Both policies trained 20 steps and were evaluated at step 0 and 20; the solver's
    figure did not fall. Prints the figures, whatever the outcome."""
    solver = figures(records, "solver", ("accuracy",))
    verifier = figures(
        records, "verifier", ("balanced_accuracy", "answers_balanced_accuracy", "held_out")
    )
    judged = [r for r in records if r.get("policy") == "verifier" and "judged" in r]
    said = f"{seconds:.0f} s\n{solver}\n{verifier}\n" + (
        f"verifier on the solver's answers during training (last window): {judged[-1]}"
        if judged
        else "no judged window"
    )
    print(said)
    for policy in ("solver", "verifier"):
        trained = [r["step"] for r in records if r.get("policy") == policy and "loss" in r]
        assert max(trained, default=0) >= 20, f"{policy} trained {trained}\n{said}"
        held_out = {r["step"]: r["held_out"] for r in records
                    if r.get("policy") == policy and "held_out" in r}  # fmt: skip
        assert {0, 20} <= held_out.keys(), f"{policy}: {held_out}\n{said}"
        assert all(0.0 <= v <= 1.0 for v in held_out.values()), said
        if policy == "solver":
            assert held_out[20] >= held_out[0], said


@pytest.mark.timeout(RUN_SECONDS + 600)
def test_a_frozen_smollm2_judge_scores_a_smollm2_solver_with_its_agreement_reported(
    tmp_path: Path,
) -> None:
    """The solver trains its 3 steps on the judge's verdicts; every verdict given is compared
    with the exact reward. Prints the judge's figures, whatever they are: how well a 135M
    model judges sums is measured here, not promised."""
    records, seconds = run(tmp_path / "judged", JUDGED)
    steps = [r["step"] for r in records if r.get("policy") == "solver" and "loss" in r]
    judged = [r for r in records if r.get("source") == "workflow" and r.get("policy") == "judge"]
    verdicts = sum(r["verdicts"] for r in judged)
    agreed = sum(r["agreement"] * r["verdicts"] for r in judged)
    yes = sum(r["judged_right_share"] * r["verdicts"] for r in judged)
    right = sum(r["exactly_right_share"] * r["verdicts"] for r in judged)
    runner = (tmp_path / "judged" / "runs" / "smollm2-judge" / "logs").glob("*workflow-0.log")
    stopped = [
        line for log in runner for line in log.read_text().splitlines() if "stopped:" in line
    ]
    print(
        f"{seconds:.0f} s; solver steps {steps}; {verdicts} verdicts: agreement "
        f"{agreed / max(verdicts, 1):.3f}, judged right {yes / max(verdicts, 1):.3f}, "
        f"exactly right {right / max(verdicts, 1):.3f}; runner: {stopped}"
    )
    assert max(steps, default=0) >= 3, steps
    assert verdicts >= 3 * 32  # every sample trained on was judged
    assert stopped, "the runner did not say what it dropped"


def workflow_reports(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("source") == "workflow"]


@pytest.mark.timeout(RUN_SECONDS + 600)
def test_smollm2_calls_the_calculator_tool_after_its_warm_up_and_trains_on_it(
    tmp_path: Path,
) -> None:
    """After 30 warm-up steps on transcripts, SmolLM2 calls the sandboxed calculator in most
    conversations, and every RL step trains with the tool's output masked out. Prints the
    figures: conversations, tool calls, turns, held-out before and after."""
    records, seconds = run(tmp_path / "calculator", CALCULATOR)
    steps = [r for r in records if r.get("policy") == "agent" and "shown_fraction" in r]
    reports = workflow_reports(records)
    n = sum(r["conversations"] for r in reports)
    share = sum(r["tool_call_share"] * r["conversations"] for r in reports) / max(n, 1)
    turns = sum(r["turns_mean"] * r["conversations"] for r in reports) / max(n, 1)
    held_out = {r["step"]: r["held_out"] for r in records if "held_out" in r}
    print(
        f"{seconds:.0f} s; {n} conversations, tool-call share {share:.3f}, {turns:.2f} turns; "
        f"shown fractions {[round(r['shown_fraction'], 3) for r in steps]}; held-out {held_out}"
    )
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert share >= 0.5, share
    assert all(r["shown_fraction"] > 0 for r in steps)  # the tool's answers, masked


@pytest.mark.timeout(RUN_SECONDS + 600)
def test_a_smollm2_solver_answers_again_after_a_smollm2_verifiers_critique(
    tmp_path: Path,
) -> None:
    """Both SmolLM2 policies train their 3 steps; the solver's batches hold the critique it
    was shown (masked), the verifier's nothing masked. Prints the held-out figures."""
    records, seconds = run(tmp_path / "critique", CRITIQUE)
    steps = {
        policy: [r for r in records if r.get("policy") == policy and "shown_fraction" in r]
        for policy in ("solver", "verifier")
    }
    held_out = {
        policy: {r["step"]: round(r["held_out"], 3) for r in records
                 if r.get("policy") == policy and "held_out" in r}
        for policy in ("solver", "verifier")
    }  # fmt: skip
    print(f"{seconds:.0f} s; held-out {held_out}")
    assert [len(s) for s in steps.values()] == [3, 3]
    assert all(r["shown_fraction"] > 0.3 for r in steps["solver"])
    assert all(r["shown_fraction"] == 0 for r in steps["verifier"])


@pytest.mark.timeout(RUN_SECONDS + 600)
def test_smollm2_trains_sharded_over_two_ranks_holding_half_each_and_publishing_parts(
    tmp_path: Path,
) -> None:
    """`examples/smollm2-sharded.yaml`: two ranks of one trainer shard SmolLM2 (fsdp2) for 3
    steps. Each rank holds half of what one data-parallel rank would (parameters, gradients
    and AdamW state: 16 bytes a parameter), and every version goes out in two parts. Prints
    each rank's held and resident memory and the held-out figures."""
    records, seconds = run(tmp_path / "sharded", SHARDED)
    steps = [r for r in records if r.get("policy") == "solver" and "loss" in r]
    first = next(r for r in steps if r["step"] == 1)
    held = [first[f"held_mib_rank{r}"] for r in range(2)]
    resident = [first[f"rss_gb_rank{r}"] for r in range(2)]
    held_out = {r["step"]: r["held_out"] for r in records if "held_out" in r}
    print(f"{seconds:.0f} s; held MiB per rank {held}, resident GiB {resident}; {held_out}")
    logs = tmp_path / "sharded" / "runs" / "smollm2-sharded" / "logs"
    trainer = "".join(log.read_text() for log in logs.glob("*trainer*.log"))
    assert [r["step"] for r in steps] == [1, 2, 3]
    whole = 16 * 134_515_008 / 2**20  # SmolLM2-135M's parameters, 16 bytes each
    for mib in held:
        assert mib == pytest.approx(whole / 2, rel=0.05), held
    assert "published in 2 parts: keyframe" in trainer
    assert "published in 2 parts: delta" in trainer
