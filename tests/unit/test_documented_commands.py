"""Every command the docs give runs somewhere: in a named test, as written, or in CI.

The tests named here read their commands from the docs (`tests/documented.py`), so a new or
changed command in README.md, the chart's README and NOTES.txt, or an example's header
fails this test until a test runs it. That `make quickstart` runs the documented `polyrl run`
is checked by running make (tests/integration/test_documented_commands.py).
"""

from __future__ import annotations

import ast

from tests import documented

CI = "CI: `make test` is what .ci/run runs"
CLUSTER_PATH = "test_the_readme_cluster_path_runs_as_written_with_the_charts_operator_pod"
CHART = "test_the_charts_readme_installs_with_helm_and_with_the_kustomization"
BY_HAND = "test_the_readmes_hand_started_cluster_commands_run_as_written"
LEARNING = "test_the_quickstart_solver_learns_from_rewards_and_the_verifier_improves"
THREE = "test_the_three_policy_example_warms_up_and_evaluates_every_policy"
MATH_DATASET = "test_the_math_dataset_example_runs_from_files_to_synced_weights"
TWO_TOKENIZERS = "test_two_policies_with_different_tokenizers_and_chat_templates_train_together"
CALCULATOR = "test_the_calculator_example_calls_its_tool_and_trains_with_the_tools_output_masked"
CRITIQUE = "test_the_critique_example_trains_a_solver_on_two_turns_around_the_verifiers_reply"
JUDGE = "test_the_judge_example_scores_a_trained_solver_with_a_frozen_judges_verdicts"
SMOLLM2_JUDGE = "test_a_frozen_smollm2_judge_scores_a_smollm2_solver_with_its_agreement_reported"
SMOLLM2_CALCULATOR = "test_smollm2_calls_the_calculator_tool_after_its_warm_up_and_trains_on_it"
SMOLLM2_CRITIQUE = "test_a_smollm2_solver_answers_again_after_a_smollm2_verifiers_critique"
SMOLLM2_SHARDED = (
    "test_smollm2_trains_sharded_over_two_ranks_holding_half_each_and_publishing_parts"
)
VLLM_CPU = "test_polyrl_run_serves_a_job_with_vllm_rollouts_in_their_own_environment"
SMOLLM2 = "test_smollm2_learns_sums_from_rewards_for_two_seeds_and_not_from_shuffled_ones"
SMOLLM2_SV = (
    "test_a_smollm2_solver_and_a_smollm2_verifier_train_20_steps_each_with_figures_at_both_ends"
)
SMOLLM2_SV_LORA = (
    "test_the_smollm2_solver_and_verifier_train_as_adapters_on_one_shared_rollout_pool"
)

BY_SECTION = {
    ("README.md", "On a cluster"): CLUSTER_PATH,
    ("README.md", "Starting and stopping a control plane by hand"): BY_HAND,
    ("charts/polyrl/README.md", "Install"): CHART,
    ("charts/polyrl/README.md", "Without Helm"): CHART,
    (documented.NOTES, ""): CLUSTER_PATH,  # the notes `helm install` printed, rendered
    ("examples/solver-verifier.yaml", ""): CLUSTER_PATH,
}
BY_COMMAND = {
    "make test": CI,
    "make install-vllm": CI,  # `make test` depends on it
    # The learning test runs the README's quick-start commands (make test-learning).
    "make quickstart": LEARNING,  # its recipe, checked below
    ". .venv/bin/activate": LEARNING,
    "polyrl run examples/quickstart.yaml --run-dir runs/qs": LEARNING,
    "polyrl export runs/qs solver-hf --policy solver": LEARNING,
    "polyrl run examples/quickstart.yaml": LEARNING,  # the quick start's header
    "kubectl apply -f examples/quickstart.yaml": CLUSTER_PATH,  # the same line in NOTES.txt
    "polyrl run examples/three-policies.yaml --run-dir runs/three": THREE,
    "polyrl run examples/two-tokenizers.yaml --run-dir runs/two": TWO_TOKENIZERS,
    "polyrl run examples/calculator.yaml --run-dir runs/calculator": CALCULATOR,
    "polyrl run examples/critique.yaml --run-dir runs/critique": CRITIQUE,
    "polyrl run examples/judge.yaml --run-dir runs/judge": JUDGE,
    "polyrl run examples/smollm2-judge.yaml --run-dir runs/smollm2-judge": SMOLLM2_JUDGE,
    "polyrl run examples/smollm2-calculator.yaml --run-dir runs/smollm2-calculator": (
        SMOLLM2_CALCULATOR
    ),
    "polyrl run examples/smollm2-critique.yaml --run-dir runs/smollm2-critique": SMOLLM2_CRITIQUE,
    "polyrl run examples/smollm2-sharded.yaml --run-dir runs/smollm2-sharded": SMOLLM2_SHARDED,
    "python examples/math_dataset.py --out data/math": MATH_DATASET,
    "polyrl run examples/math-dataset.yaml --run-dir runs/math": MATH_DATASET,
    "polyrl run examples/vllm-cpu.yaml --run-dir runs/vllm-cpu": VLLM_CPU,  # make test-vllm
    "make smollm2": CI,  # `make test` depends on it
    # Run as written by `make test-learning-smollm2` (its seed-0 run).
    "polyrl run examples/smollm2-arithmetic.yaml --run-dir runs/smollm2": SMOLLM2,
    "polyrl run examples/smollm2-solver-verifier.yaml --run-dir runs/smollm2-sv": SMOLLM2_SV,
    "polyrl run examples/smollm2-solver-verifier-lora.yaml --run-dir runs/smollm2-sv-lora": (
        SMOLLM2_SV_LORA
    ),
}


def where_run(command: documented.Command) -> str | None:
    return BY_COMMAND.get(command.text) or BY_SECTION.get((command.source, command.heading))


def defined_tests() -> set[str]:
    names = set()
    for path in (documented.REPO / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(node.name)
    return names


def test_every_documented_command_is_run_by_a_named_test_or_ci() -> None:
    found = documented.commands()
    assert len(found) >= 25, "the docs' commands were not found"
    unmapped = [f"{c.source} [{c.heading}]: {c.text}" for c in found if where_run(c) is None]
    assert not unmapped, "documented commands that no test runs:\n" + "\n".join(unmapped)
    tests = defined_tests()
    named = {where_run(c) for c in found} - {CI}
    assert named <= tests, f"named tests that do not exist: {named - tests}"


def test_the_readme_cluster_section_has_no_watch_over_several_types() -> None:
    for command in documented.commands():
        if command.text.startswith("kubectl get") and " -w" in f" {command.text} ":
            kinds = command.text.split()[2]
            assert "," not in kinds, f"kubectl watches one resource type: {command.text}"
