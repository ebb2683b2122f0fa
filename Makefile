# Every target creates .venv when missing, so a fresh clone needs only Python (3.11, or
# 3.12 or 3.13 where 3.11 is not installed; `make PYTHON=/path/to/python` to choose).
PYTHON ?= $(or $(shell command -v python3.11 2>/dev/null),$(shell command -v python3.12 2>/dev/null),$(shell command -v python3.13 2>/dev/null),python3.11)
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: run test test-full lint typecheck ts-build ts-test bench big-stores plans soak fuzz simulate clean

# What make run serves: the gateway, and for the demo's example tools and agents the Python
# client with the MCP SDK (the example MCP server); no test or lint tools.
$(RUN_STAMP): pyproject.toml clients/python/pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e . -e 'clients/python[mcp]'
	touch $(RUN_STAMP)

# What the tests, linters and benchmarks need on top: the dev extra.
$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install --quiet -e '.[dev]' -e clients/python
	touch $(STAMP)

# The TypeScript client (clients/typescript): exactly the dev dependencies of its lockfile.
TS := clients/typescript
TS_STAMP := $(TS)/node_modules/.installed

$(TS_STAMP): $(TS)/package.json $(TS)/package-lock.json
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error
	touch $(TS_STAMP)

run: $(RUN_STAMP)
	$(BIN)/python -m examples.run_demo --config config/gateway.toml

LINT_PATHS := $(wildcard gateway clients tests examples bench/*.py)

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

typecheck: $(STAMP)
	$(BIN)/mypy --strict gateway clients/python/idempotency_gateway_client

# The TypeScript client built into clients/typescript/dist (examples/agent_recovery.mjs uses it).
ts-build: $(TS_STAMP)
	cd $(TS) && npm run --silent build

# The TypeScript client: type-checked (sources and framework examples, strict; the script
# builds first), then `node --test` against gateways started from .venv (hence $(STAMP)).
# --ignore-scripts skips only `pretest`, a second build of the sources just built.
ts-test: $(STAMP) $(TS_STAMP)
	cd $(TS) && npm run --silent typecheck && npm test --ignore-scripts

# One pytest worker per core: the tests are independent (port 0, tmp_path, a
# PostgreSQL schema each). The 15 slowest are listed last.
PYTEST := $(BIN)/python -m pytest -n auto --durations=15

# The suite starts hundreds of Python processes (gateways, agents, CLIs, benchmarks, pytest
# itself); where the environment turns Python's bytecode cache off, each compiled its
# modules again, and pytest re-rewrote every plugin's. The tests write it (__pycache__,
# ignored by git).
test test-full: export PYTHONDONTWRITEBYTECODE :=

# The fast profile (tests/suite_profile.py): the slowest properties (schemathesis, hypothesis,
# the simulation's seeds, the benchmarks' smoke runs) at a share of their counts.
test: lint typecheck ts-test
	$(PYTEST)

# The same with every property at its full count (GATEWAY_TEST_PROFILE=full), as the tests
# state them.
test-full: lint typecheck ts-test
	GATEWAY_TEST_PROFILE=full $(PYTEST)

# The gateway against a plain aiohttp proxy and the store at 1M operations, in one
# run (about 12 minutes on 2 cores); writes bench/RESULTS.md. Its first section is the
# gateway as installed (access log on, uvloop), beside the tuned rows. wrk drives the HTTP
# rows when installed (Debian package wrk), else an aiohttp client.
bench: $(STAMP)
	$(BIN)/python -m bench.run --write

# The store at 1 thousand, 1 million and 10 million operations (bench/big_stores.py), one
# table per store. STORE=sqlite or postgres; SIZES to choose; KEEP=DIR fills SQLite files there
# once and reuses them (ten million take a while: about 24 GB and most of an hour here).
STORE ?= sqlite
SIZES ?= 1000,1000000,10000000
big-stores: $(STAMP)
	$(BIN)/python -m bench.big_stores --store $(STORE) --sizes $(SIZES) $(if $(KEEP),--keep $(KEEP))

# The hot path's query plans on a store of ROWS operations, both stores (tests/test_query_plans.py;
# make test runs it at 20,000).
ROWS ?= 10000000
plans: $(STAMP)
	GATEWAY_PLAN_ROWS=$(ROWS) $(BIN)/python -m pytest tests/test_query_plans.py -p no:randomly

# The gateway's memory under 10 minutes of new keys; replaces the soak section of bench/RESULTS.md.
soak: $(STAMP)
	$(BIN)/python -m bench.soak --minutes 10 --write

# Hostile bytes against the request path for 60 s (atheris if installed, else hypothesis).
fuzz: $(STAMP)
	$(BIN)/python tests/fuzz_request_path.py --seconds 60

# The deterministic simulation (tests/simulation) for SECONDS (default 600), seed after seed;
# exits 1 at the first broken invariant, naming the seed to replay with --seed. TOLERATE
# names answer-state classes still known open (see KNOWN_ENGINE_BUGS in tests/test_simulation.py).
SECONDS ?= 600
TOLERATE ?= other-operation
simulate: $(STAMP)
	$(BIN)/python -m tests.simulation --seconds $(SECONDS) $(foreach class,$(TOLERATE),--tolerate $(class))

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info clients/python/*.egg-info $(TS)/node_modules $(TS)/dist
