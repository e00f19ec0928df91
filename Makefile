# Two entry points on a fresh machine (Python 3.11+ with venv):
#   make run   install the project and run the canonical scenario
#   make test  install the project with its dev tools, llama-server and chromium, run every check CI runs
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-real lint bench clean llama-server chromium postgresql dist-check

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	# an editable install compiles no bytecode (a wheel's does); without it every run compiles
	# each module it imports, where PYTHONDONTWRITEBYTECODE is set
	$(BIN)/python -m compileall -q src >/dev/null
	touch $@

run: $(VENV)/.installed
	$(BIN)/llmgw-twin run scenarios/node-loss.yaml

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# llama.cpp's llama-server and ggml-rpc-server, built from source once (pip caches the wheel)
llama-server: $(VENV)/.installed
	bash scripts/install-llama-server.sh

# Debian's Chromium for the browser tests (Playwright drives it; it downloads no browser)
chromium:
	bash scripts/install-chromium.sh

# Debian's PostgreSQL for the store's tests (a throwaway server per run; no service is started)
postgresql:
	bash scripts/install-postgresql.sh

# the wheel and sdist, installed as users install them: pip (wheel, sdist) and pipx (docs/install.md)
dist-check: $(VENV)/.installed
	bash scripts/check-dist.sh

test: lint llama-server chromium postgresql dist-check
	$(BIN)/llmgw-twin run -q scenarios/*.yaml
	$(BIN)/pytest -q -n 2

# every scenario file on real processes with the twin's decisions, two at a time (33 min on a 2-core machine)
test-real: $(VENV)/.installed
	$(BIN)/pytest -q -m real_suite -n 2 tests/test_real_suite.py

# every benchmark, its figures written into docs/performance.md; exit 1 when a goal is missed
# (ARGS=--long adds the long ones, ARGS=--only twin,router runs some)
bench: $(VENV)/.installed
	$(BIN)/python benchmarks/all.py $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
