# Every target creates .venv when missing, so a fresh clone needs only Python (3.11, or
# 3.12 or 3.13 where 3.11 is not installed; `make PYTHON=/path/to/python` to choose).
PYTHON ?= $(or $(shell command -v python3.11 2>/dev/null),$(shell command -v python3.12 2>/dev/null),$(shell command -v python3.13 2>/dev/null),python3.11)
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: run test test-full lint typecheck collect ts-build ts-test ts-typecheck ts-suite bench big-stores plans soak fuzz simulate clean

# pip installs without compiling every module of every dependency to bytecode up front:
# Python compiles (and caches) each module the first time it is imported, and most of what
# is installed (type checkers, the SDKs the docs' blocks are checked against) never is. The
# test venv's install took 32 s instead of 53 s on a 2-core machine.
PIP_INSTALL := $(BIN)/pip install --quiet --no-compile

# The venv both installs start from: created when missing, with a current pip.
define NEW_VENV
test -d $(VENV) || $(PYTHON) -m venv $(VENV)
$(BIN)/pip install --quiet --upgrade pip
endef

# What make run serves: the gateway, and for the demo's example tools and agents the Python
# client with the MCP SDK (the example MCP server); no test or lint tools.
$(RUN_STAMP): pyproject.toml clients/python/pyproject.toml
	$(NEW_VENV)
	$(PIP_INSTALL) -e . -e 'clients/python[mcp]'
	touch $(RUN_STAMP)

# What the tests, linters and benchmarks need: what make run needs and the dev extra, in one
# pip run (two took 45 s on a fresh clone, one 35 s: pip resolves and checks once).
$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(NEW_VENV)
	$(PIP_INSTALL) -e '.[dev]' -e 'clients/python[mcp]'
	touch $(RUN_STAMP) $(STAMP)

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

# The TypeScript client built into clients/typescript/dist (examples/agent_recovery.mjs uses it),
# again only when a source changed: the tests read dist while they run (a build writes it in
# place), so nothing in `make test` builds it once pytest has started.
TS_BUILT := $(TS)/node_modules/.built
$(TS_BUILT): $(TS_STAMP) $(wildcard $(TS)/src/*.ts $(TS)/tsconfig*.json $(TS)/scripts/*.mjs)
	cd $(TS) && npm run --silent build
	touch $(TS_BUILT)

ts-build: $(TS_BUILT)

# The TypeScript client: type-checked (sources and framework examples, strict), then
# `node --test` against gateways started from .venv (hence $(STAMP)). --ignore-scripts skips
# only `pretypecheck` and `pretest`, builds of the sources $(TS_BUILT) just built.
ts-test: ts-typecheck
	@$(MAKE) --no-print-directory ts-suite

ts-typecheck: $(TS_BUILT)
	cd $(TS) && npm run --silent typecheck --ignore-scripts

ts-suite: $(STAMP) $(TS_BUILT)
	cd $(TS) && npm test --ignore-scripts

# Three pytest workers per core: the tests are independent (port 0, tmp_path, a PostgreSQL
# schema each), and much of their time is spent waiting (leases and timeouts running out,
# subprocesses starting, the README walk-through's 30 s timeouts), not computing. On a
# quiet 2-core machine pytest took 299 s with 4 workers and 258 s with 6.
# `make test PYTEST_WORKERS=auto` runs one a core. The 15 slowest tests are listed last.
CORES := $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
PYTEST_WORKERS ?= $(shell echo $$(( 3 * $(CORES) )))
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --durations=15

# The suite starts hundreds of Python processes (gateways, agents, CLIs, benchmarks, pytest
# itself); where the environment turns Python's bytecode cache off, each compiled its
# modules again, and pytest re-rewrote every plugin's. The tests write it (__pycache__,
# ignored by git).
test test-full collect: export PYTHONDONTWRITEBYTECODE :=

# pytest rewrites the asserts of every test module and plugin and caches the result beside
# each source; in a fresh clone each of the six workers did it again (collecting took 13 s
# of CPU fresh, 5.5 s cached, in a phase where both cores are busy throughout). One
# collection beside mypy leaves the cache for all of them.
collect: $(STAMP)
	@$(BIN)/python -m pytest --collect-only -q >.collect.log || { cat .collect.log; exit 1; }
	@tail -n 1 .collect.log

# The TypeScript suite (ts-suite) runs beside pytest, its output kept in .ts-test.log and
# printed once both are done (all of it if it failed); either failing fails the target.
BESIDE_TS = $(MAKE) --no-print-directory ts-suite >.ts-test.log 2>&1 & ts=$$!; \
	$(1); py=$$?; wait $$ts; ts=$$?; \
	if [ $$ts -eq 0 ]; then tail -n 8 .ts-test.log; else cat .ts-test.log; fi; \
	echo "pytest: exit $$py; TypeScript suite (make ts-suite): exit $$ts"; \
	[ $$py -eq 0 ] && [ $$ts -eq 0 ]

# The fast profile (tests/suite_profile.py): the slowest properties (schemathesis, hypothesis,
# the simulation's seeds, the benchmarks' smoke runs) at a share of their counts.
# What comes first runs side by side too: the venv (pip keeps one core busy for half a minute)
# beside `npm ci`, the TypeScript build and its type check; then ruff, mypy and one
# collection of the tests (`collect`) side by side.
test:
	@$(MAKE) --no-print-directory -j4 --output-sync=target lint typecheck ts-typecheck collect
	@$(call BESIDE_TS,$(PYTEST))

# The same with every property at its full count (GATEWAY_TEST_PROFILE=full), as the tests
# state them.
test-full:
	@$(MAKE) --no-print-directory -j4 --output-sync=target lint typecheck ts-typecheck collect
	@$(call BESIDE_TS,GATEWAY_TEST_PROFILE=full $(PYTEST))

# The gateway against a plain aiohttp proxy and the store at 1M operations, in one
# run (about 12 minutes on 2 cores); writes bench/RESULTS.md. Its first section is the
# gateway as installed (access log on, uvloop), beside the tuned rows. wrk drives the HTTP
# rows when installed (Debian package wrk), else an aiohttp client.
bench: $(STAMP)
	$(BIN)/python -m bench.run --write

# The store at 1 thousand, 1 million and 10 million operations (bench/big_stores.py), one
# table per store. STORE=sqlite or postgres; SIZES to choose; KEEP=DIR fills SQLite files there
# once and reuses them (ten million: about 25 GB, 8 minutes to fill on a quiet 2-core machine).
STORE ?= sqlite
SIZES ?= 1000,1000000,10000000
big-stores: $(STAMP)
	$(BIN)/python -m bench.big_stores --store $(STORE) --sizes $(SIZES) $(if $(KEEP),--keep $(KEEP))

# The hot path's query plans on a store of ROWS operations, both stores (tests/test_query_plans.py;
# make test runs it at 20,000). KEEP=DIR: the SQLite test uses big-stores' kept file of ROWS.
ROWS ?= 10000000
plans: $(STAMP)
	GATEWAY_PLAN_ROWS=$(ROWS) $(if $(KEEP),GATEWAY_PLAN_KEEP=$(KEEP)) $(BIN)/python -m pytest tests/test_query_plans.py

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
