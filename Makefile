# Quick start: `make run` (the broker on the embedded default config) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint typecheck bench fuzz clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,analytics]'
	rm -f $(VENV)/.installed-* && touch $@

run: $(STAMP)
	$(BIN)/amqpbroker run --config config/broker.yaml --data-dir ./data

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	bash bench/run.sh

# Hostile-input fuzzer (issue 15): DURATION seconds per mode (security off, then on with a
# PLAIN user), SEED to replay a run. Prints cases=N crashes=0 unexpected=0 unanswered=0.
DURATION ?= 60
SEED ?=
fuzz: $(STAMP)
	PYTHONPATH=.:tests $(BIN)/python tests/fuzz/amqp_fuzz.py --duration $(DURATION) $(if $(SEED),--seed $(SEED))

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
