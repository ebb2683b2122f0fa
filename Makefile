# Every target creates .venv when missing, so a fresh clone needs only Python 3.11.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench fuzz clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e clients/python
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m examples.run_demo --config config/gateway.toml

LINT_PATHS := $(wildcard gateway clients tests examples bench/*.py)

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

typecheck: $(STAMP)
	$(BIN)/mypy --strict gateway clients/python/idempotency_gateway_client

test: lint typecheck
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
