# Quick start: `make run` (the broker on the embedded default config) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps (issue 16 item 8): `make run` installs the broker alone; `make test` adds the
# test and PySpark extras (~650 MB). Either is redone when pyproject.toml changes.
HASH := $(shell cksum < pyproject.toml | cut -d' ' -f1)
STAMP := $(VENV)/.installed-broker-$(HASH)
DEV_STAMP := $(VENV)/.installed-dev-$(HASH)

# Python writes the checkout's bytecode (__pycache__/, git-ignored) even where the shell
# sets PYTHONDONTWRITEBYTECODE: with it, every broker, CLI and driver process compiled the
# ~280 modules it imports again (a broker start ~1.1 CPU-s instead of ~0.55) and each pytest
# process re-rewrote every test module (collection 13 CPU-s instead of 5). docs/decisions.md,
# "Suite time, third pass".
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-long test-compiled test-paging-long lint typecheck bench fuzz clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	rm -f $(VENV)/.installed-broker-* && touch $@

# One install, not the broker's and then the extras' (each an editable build of its own,
# ~7.6 CPU-s more on a fresh clone: docs/decisions.md, "Suite time, fourth pass"); it
# satisfies the broker's stamp too.
$(DEV_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -f $(STAMP) || $(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,analytics]'
	rm -f $(VENV)/.installed-dev-* $(VENV)/.installed-broker-* && touch $@ $(STAMP)

run: $(STAMP)
	@echo "The amqpbroker command is $(BIN)/amqpbroker (not on PATH): run it as $(BIN)/amqpbroker, or 'source $(BIN)/activate' first."
	$(BIN)/amqpbroker run --config config/broker.yaml --data-dir ./data

# pytest: two xdist workers on the two cores (PYTEST_WORKERS; a third was measured slower
# on the quiet machine: docs/decisions.md, "Suite time, sixth pass"), a
# module per worker at a time, tests/analytics/ and
# tests/interop/ one unit each (one Spark JVM; the client stacks' installs one at a time:
# tests/conftest.py), then the wall-clock `timing` tests alone in one process, collected
# from tests/integration/ only (tests/conftest.py fails a `timing` test elsewhere); each prints
# its 15 slowest tests. Kept under 10 minutes on 2 cores: what only scale adds (a standalone
# Spark cluster, 40 crash rounds, 6,000 fuzz cases, the incremental-equals-whole analyze
# run) is `make test-long`, which CI runs next.
PYTEST_WORKERS ?= 2
test: $(DEV_STAMP)
	sh tests/support/install-browser.sh  # chromium + chromium-driver for the console tests
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m 'not timing and not long' --durations=15
	$(BIN)/pytest -m 'timing and not long' --durations=15 tests/integration

# The long tier (CI runs it after `make test`; ~6 min): the `long` tests (spark-submit on a
# standalone cluster), the crash test at 40 kills and the fuzzer at 6,000 cases.
test-long: $(DEV_STAMP)
	$(BIN)/pytest -m long --durations=5
	CRASH_ROUNDS=40 FUZZ_CASES=6000 $(BIN)/pytest tests/integration/test_crash.py tests/integration/test_fuzz.py

# Issue 23: the paging tests at ten times their size (200 MiB backlogs; several minutes).
PAGING_SCALE ?= 10
test-paging-long: $(DEV_STAMP)
	PAGING_SCALE=$(PAGING_SCALE) $(BIN)/pytest tests/integration/test_paging.py

lint: $(DEV_STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

# `make bench` (issue 20): README "Performance": the broker as it ships (config/broker.yaml,
# its hot modules compiled by mypyc: setup.py) against the Qpid Proton C example broker
# and RabbitMQ, one run, reps interleaved (bench/peers.sh; N, REPS, PEERS, ... override).
# The broker is installed (not editable) in .bench/.venv, again whenever a source changed;
# if mypyc or the C compiler fails there, it installs as pure Python. setup.py builds
# protocol/_pnloop.c with the same compiler (C_MODULES; it no longer needs cffi there).
BENCH_VENV := .bench/.venv
BENCH_STAMP := $(BENCH_VENV)/.installed-$(HASH)
$(BENCH_STAMP): pyproject.toml setup.py $(shell find amqpbroker -name '*.py' -o -name '*.[ch]')
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip 'setuptools>=77' wheel mypy
	rm -rf build  # an earlier build's extensions would go into the wheel too
	AMQPBROKER_MYPYC=1 $(BENCH_VENV)/bin/python -m pip install -q --no-build-isolation .
	rm -f $(BENCH_VENV)/.installed-* && touch $@

bench: $(BENCH_STAMP)
	bash bench/peers.sh

# `make test-compiled` (issue 20): the unit tier against the compiled build, .bench/.venv as
# `make bench` builds it (the pytest pins are the `test` extra's). AMQPBROKER_COMPILED=1
# makes tests/unit/test_build.py check that every module of setup.py's HOT_MODULES is a
# loaded extension, so a failed compile cannot pass as pure Python. `pytest`, not
# `python -m pytest`: the checkout's own amqpbroker/ must not come first on sys.path.
# 3-4 min on 2 cores from a fresh clone (the compile ~70 s); `.ci/run` runs it after
# `make test` when the CI budget leaves room (docs/decisions.md).
test-compiled: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m pip install -q 'pytest>=8' 'pytest-timeout>=2.3' 'pytest-xdist>=3.6'
	AMQPBROKER_COMPILED=1 $(BENCH_VENV)/bin/pytest -p no:cacheprovider -n 2 tests/unit

# Hostile-input fuzzer (issue 15): DURATION seconds per mode (security off, then on with a
# PLAIN user), SEED to replay a run. Prints cases=N crashes=0 unexpected=0 unanswered=0.
DURATION ?= 60
SEED ?=
fuzz: $(STAMP)
	PYTHONPATH=.:tests $(BIN)/python tests/fuzz/amqp_fuzz.py --duration $(DURATION) $(if $(SEED),--seed $(SEED))

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
