# The two commands of the README:
#   make train   — set up (idempotent) and train on the embedded model: agentrl train --env $(ENV)
#                  (search: the job where the 135M model visibly learns; ENV=swe shows the SWE path)
#   make test    — set up (idempotent) and run the whole test suite
# VENV picks the virtual environment both use (CI trains on its own, .venv-train, to prove that
# `make train`'s set-up alone is enough).
ENV ?= search
ARGS ?=
VENV ?= .venv

.PHONY: setup train test test-gpu bench lint lint-imports

setup:
	@scripts/system_deps.sh
	@AGENTRL_VENV=$(VENV) scripts/setup.sh

train: setup
	$(VENV)/bin/agentrl train --env $(ENV) $(ARGS)

test:
	@AGENTRL_VENV=$(VENV) scripts/test.sh $(ARGS)

# The CUDA paths CI cannot run (tests_gpu/, docs/cluster.md): on a machine with a GPU
test-gpu:
	@AGENTRL_VENV=$(VENV) scripts/setup.sh --test
	$(VENV)/bin/python -m pytest -q -ra tests_gpu $(ARGS)

bench: setup
	@AGENTRL_VENV=$(VENV) scripts/setup.sh --test
	$(VENV)/bin/python bench/run_all.py

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python scripts/lint_imports.py

# The import contracts alone (pyproject.toml [tool.importlinter]), on the test venv: CI runs it first
lint-imports:
	@AGENTRL_VENV=$(VENV) scripts/setup.sh --test
	$(VENV)/bin/python scripts/lint_imports.py
