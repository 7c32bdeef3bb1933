# minirl: `make help` lists the targets.
PYTHON ?= python
TORCH_CPU ?= torch==2.13.0

.PHONY: help install test lint demo clean

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install: ## install minirl in editable mode with the dev and serve extras (CPU torch pinned first)
	$(PYTHON) -m pip install "$(TORCH_CPU)"
	$(PYTHON) -m pip install -e ".[dev,serve]"

test: ## run the test suite (offline, CPU)
	WANDB_MODE=offline HF_HUB_OFFLINE=1 $(PYTHON) -m pytest -q

lint: ## ruff lint and format check
	$(PYTHON) -m ruff check minirl tests
	$(PYTHON) -m ruff format --check minirl tests

demo: ## the default run: build + warm-start the tiny model, then agentic RL on CPU
	$(PYTHON) -m minirl.train

clean: ## remove run outputs
	rm -rf outputs multirun
