# Two commands on a fresh machine: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
DATA_DIR ?= .data/tpch
SCALE ?= 0.1
PARTS ?= 8
DEMO := $(CURDIR)/.demo
DEMO_DATE ?= 2026-01-01

# The embedded default: local Spark (local[1] per attempt), SQLite metadata DB, local store. Fault injection
# (a test facility, CONTRIBUTING.md "Injecting faults") makes target local-b 4x slower, so a speculative copy wins.
DEMO_ENV := AIRFLOW_HOME=$(DEMO)/airflow \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__SPECULATIVE__STORE_PATH=$(DEMO)/store \
	AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}' \
	SPECULATIVE_EXAMPLE_DATA=$(CURDIR)/$(DATA_DIR)/lineitem \
	SPECULATIVE_EXAMPLE_OUTPUT=$(DEMO)/output \
	AIRFLOW__SPECULATIVE__ENABLED=true \
	AIRFLOW__SPECULATIVE__BASELINE_RATIO=0.5 \
	AIRFLOW__SPECULATIVE__BASELINE_LOWER_BOUND=5s \
	SPECULATIVE_FAULT_INJECTION='{"targets": {"local-b": {"factor": 4}}}'

.PHONY: demo run test test-fast test-long test-lowest unit install java-check data data-q3 data-tpch lint bench clean browser ui docs services jars s3-compiled

# uv (from PyPI, into a venv of its own) installs the project: it resolves and fetches in parallel, several
# times faster than pip on a machine without a cache. It compiles bytecode at install as pip does: with
# PYTHONDONTWRITEBYTECODE set, every Airflow and attempt process would otherwise compile its imports anew.
# The project's venv still has pip for users.
TOOLS_VENV ?= .venv-tools
UV := $(TOOLS_VENV)/bin/uv
$(UV):
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required)"; exit 1; }
	test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install --quiet 'uv>=0.5'

$(VENV)/.installed: setup.cfg pyproject.toml | $(UV)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(UV) pip install --python $(PY) --quiet --compile-bytecode -e '.[test]'
	touch $@

install: $(VENV)/.installed

java-check:
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])' || { echo "error: Java 17+ is required for Spark (java -version)"; exit 1; }

# One table of tpchgen-cli as PARTS Parquet files under $(DATA_DIR)/<table>/ (deterministic per table).
$(DATA_DIR)/%/.done: | $(VENV)/.installed
	rm -rf $(DATA_DIR)/$*
	$(VENV)/bin/tpchgen-cli parquet -s $(SCALE) --tables $* --parts $(PARTS) --output-dir $(DATA_DIR)
	touch $@

data: $(DATA_DIR)/lineitem/.done

# The join example (dags/tpch_q3.py) and bench/warm.py also read customer and orders;
# e.g. `make data-q3 DATA_DIR=.data/tpch-sf1 SCALE=1` for the scale factor 1 benchmark.
data-q3: $(DATA_DIR)/lineitem/.done $(DATA_DIR)/customer/.done $(DATA_DIR)/orders/.done

# The other join examples: dags/tpch_q10.py, tpch_q18.py and tpch_q9.py also read nation, part,
# supplier and partsupp (nation has 25 rows: tpchgen-cli writes it as one part whatever PARTS is).
data-tpch: data-q3 $(DATA_DIR)/nation/.done $(DATA_DIR)/part/.done $(DATA_DIR)/supplier/.done \
	$(DATA_DIR)/partsupp/.done

# The demo's attempts run on a local pool of two Spark Connect servers (local-a, local-b) that
# scripts/demo.sh starts and stops; `make demo DEMO_TARGETS=spark-submit` uses one spark-submit per attempt.
# WARM_UP_ROUNDS=N (make demo, make run): rounds of the warm-up query each server runs before the DAG
# (default 4; fewer start the pool sooner and leave more of the warm-up to the run's first attempts).
DEMO_TARGETS ?= connect
WARM_UP_ROUNDS ?=
demo: install java-check data
	rm -rf $(DEMO)
	$(DEMO_ENV) $(PY) scripts/demo_env.py write $(DEMO)
	$(DEMO_ENV) DEMO=$(DEMO) DEMO_DATE=$(DEMO_DATE) DEMO_TARGETS=$(DEMO_TARGETS) WARM_UP_ROUNDS=$(WARM_UP_ROUNDS) \
		VENV=$(VENV) scripts/demo.sh
	@$(PY) scripts/demo_env.py hint $(DEMO)

# Your own DAG on the embedded default, as the demo runs the example (SQLite, a local store, a local pool
# of two Spark Connect servers started and stopped around the run; no fault injection):
#   make run DAGS=path/to/your/dags DAG=your_dag_id [RUN_DATE=2026-01-01] [RUN_TARGETS=connect|spark-submit]
#            [WARM_UP_ROUNDS=N]
# Everything goes under $(RUN) (emptied first); its env.sh gives you that Airflow afterwards.
RUN ?= $(CURDIR)/.run
RUN_DATE ?= $(DEMO_DATE)
RUN_TARGETS ?= connect
RUN_ENV := AIRFLOW_HOME=$(RUN)/airflow \
	AIRFLOW__CORE__DAGS_FOLDER=$(abspath $(DAGS)) \
	AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__SPECULATIVE__STORE_PATH=$(RUN)/store \
	AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}' \
	AIRFLOW__SPECULATIVE__ENABLED=true
run: install java-check
	@test -n "$(DAGS)" && test -n "$(DAG)" && test -d "$(DAGS)" || { echo "usage: make run DAGS=<folder of your DAG files> DAG=<dag_id> [RUN_DATE=YYYY-MM-DD] [RUN_TARGETS=connect|spark-submit]" >&2; exit 2; }
	@# RUN may point anywhere: empty it only if an earlier `make run` made it (its marker is there).
	@if [ -e "$(RUN)" ] && [ ! -e "$(RUN)/.made-by-make-run" ]; then echo "error: $(RUN) exists and was not made by \`make run\`; it is not emptied: choose another RUN=" >&2; exit 2; fi
	rm -rf $(RUN)
	mkdir -p $(RUN) && touch $(RUN)/.made-by-make-run
	$(RUN_ENV) $(PY) scripts/demo_env.py write $(RUN)
	$(RUN_ENV) DEMO=$(RUN) DEMO_DATE=$(RUN_DATE) DEMO_TARGETS=$(RUN_TARGETS) DAG_ID=$(DAG) \
		WARM_UP_ROUNDS=$(WARM_UP_ROUNDS) VENV=$(VENV) scripts/demo.sh
	@$(PY) scripts/demo_env.py hint $(RUN)

# The Airflow UI with the plugin on the demo's home: starts every component, triggers the example and
# prints the run view's URL and a login; Ctrl-C stops everything it started (attempts included).
ui: install java-check data services
	@test -f $(DEMO)/airflow/airflow.cfg || $(DEMO_ENV) $(PY) scripts/demo_env.py write $(DEMO)
	$(DEMO_ENV) $(PY) scripts/demo_ui.py $(UI_ARGS)

# The UI plugin's browser test drives Debian's Chromium (never a downloaded browser build).
browser:
	@test -x /usr/bin/chromium || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; } \
		|| { echo "error: the browser test needs /usr/bin/chromium: apt-get install -y chromium chromium-driver (as root)"; exit 1; }

# What the suite starts or uses beside Python packages, from Debian's packages where missing (idempotent):
# PostgreSQL's and Redis's server binaries (devtools/services.py starts throw-away servers on free
# loopback ports; nothing needs to run beforehand), iproute2 and nftables for the hosts tests.
# RUNLEVEL=1 keeps the packages' own init scripts from starting system-wide servers on 5432 and 6379.
services:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v ip >/dev/null && command -v tc >/dev/null || missing="$$missing iproute2"; \
	command -v nft >/dev/null || missing="$$missing nftables"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "error: the tests need Debian's$$missing: apt-get install -y$$missing (as root)"; exit 1; fi; \
		echo "installing$$missing (Debian packages) ..."; \
		apt-get update -qq && RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
			|| { echo "error: apt-get install$$missing failed"; exit 1; }; \
	fi

# hadoop-aws and the AWS SDK bundle (about 700 MB) from Maven Central at the Hadoop version the installed
# pyspark bundles (jars/s3a/pom.xml): what Spark needs to read and write s3:// (docs/store.md). Then the
# provider's commit protocol jar, compiled with the local JDK into its cache (docs/store.md, "Exchange commit").
HADOOP_VERSION = $(shell $(PY) -c 'from airflow_provider_speculative.devtools.localcluster import pyspark_hadoop_version as v; print(v())' 2>/dev/null)
jars: install
	@test -n "$(HADOOP_VERSION)" || { echo "error: cannot tell pyspark's Hadoop version (is the venv installed?)"; exit 1; }
	@test -f .jars/s3a-$(HADOOP_VERSION)/.done || { \
		command -v mvn >/dev/null || { echo "error: Maven (mvn) is required to fetch the s3a jars"; exit 1; }; \
		rm -rf .jars/s3a-$(HADOOP_VERSION) && \
		mvn -q -B -f jars/s3a/pom.xml -Dhadoop.version=$(HADOOP_VERSION) dependency:copy-dependencies \
			-DincludeScope=runtime -DoutputDirectory=$(CURDIR)/.jars/s3a-$(HADOOP_VERSION) && \
		touch .jars/s3a-$(HADOOP_VERSION)/.done; }
	@$(PY) -m airflow_provider_speculative.backends.commitjar >/dev/null

# SeaweedFS's weed into .tools/bin from the Go module proxy at a pinned version (needs Go; several minutes):
# a compiled S3 endpoint for the benchmarks (bench/warm.py --s3-endpoint seaweedfs). The tests keep moto.
s3-compiled:
	scripts/build-seaweedfs.sh

# The unit tests first, spread over UNIT_WORKERS processes (pytest-xdist): pure Python and CPU-bound. The
# integration tests after them, one at a time: several measure attempt speeds (slow node, speculation) and
# share the session's Spark Connect pool, so they must not compete with other tests for the cores.
UNIT_WORKERS ?= 2
test: install java-check data-q3 browser services jars
	$(PY) -m pytest tests/unit -n $(UNIT_WORKERS) -ra --durations=10
	$(PY) -m pytest tests/integration -ra --durations=60

# The DuckDB differential join tests (tests/integration/test_differential_joins.py) under the `long`
# profile: hundreds of fresh Hypothesis examples per test instead of the few fixed ones `make test` runs
# (about an hour on 2 cores; each example runs real Spark stages).
test-long: install java-check
	SPECULATIVE_HYPOTHESIS_PROFILE=long $(PY) -m pytest tests/integration/test_differential_joins.py -ra \
		--hypothesis-show-statistics

# The fast tests alone (pure core, store, backends' file mapping, controller on a fake backend): seconds.
unit: install
	$(PY) -m pytest tests/unit -q -n $(UNIT_WORKERS)

# The inner loop's name for the same: no Spark, no servers.
test-fast: unit

# The unit tests on the lowest versions setup.cfg allows (issue 42): uv's `--resolution lowest-direct` puts
# the provider's own direct dependencies (install_requires and [test]) at their declared lower bounds and
# resolves everything else normally, into $(LOWEST_VENV).
LOWEST_VENV ?= .venv-lowest
$(LOWEST_VENV)/.installed: setup.cfg pyproject.toml | $(UV)
	rm -rf $(LOWEST_VENV)
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(UV) pip install --python $(LOWEST_VENV)/bin/python --quiet --compile-bytecode --resolution lowest-direct -e '.[test]'
	touch $@

test-lowest: $(LOWEST_VENV)/.installed
	$(LOWEST_VENV)/bin/python -m pytest tests/unit -q -n $(UNIT_WORKERS) -ra

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m airflow_provider_speculative.devtools.configdoc --check

# docs/configuration.md's option table, generated from the option declarations in core/config.py.
docs: install
	$(PY) -m airflow_provider_speculative.devtools.configdoc

bench: install java-check data
	$(PY) bench/speculation.py

clean:
	rm -rf .demo .run .data .pytest_cache test-artifacts
