# The two commands of the README:
#   make train   — set up (idempotent) and train on the embedded model: agentrl train --env $(ENV)
#   make test    — set up (idempotent) and run the whole test suite
ENV ?= swe
ARGS ?=
VENV ?= .venv

.PHONY: setup train test bench lint

setup:
	@scripts/system_deps.sh
	@scripts/setup.sh

train: setup
	$(VENV)/bin/agentrl train --env $(ENV) $(ARGS)

test:
	@scripts/test.sh $(ARGS)

bench: setup
	@scripts/setup.sh --test
	$(VENV)/bin/python bench/run_all.py

lint:
	$(VENV)/bin/ruff check .
