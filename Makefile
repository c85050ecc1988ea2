# Every target the README and the docs name. `make setup` is what `make demo` and `make ui` need, and
# needs only python3.11, Java 17 (or 21, 25.0.3+) and mvn: the venv with the pinned packages, the
# Spark jars (Delta, the Kafka connector) via mvn, and a smoke check. `make test-setup` is the
# same without the smoke check (the tests themselves start Spark and write Delta tables first
# thing) plus the Kafka test broker's jars; `make integration-setup` adds the browser the UI
# test of `make test-integration` drives.
# scripts/setup runs the steps, one line each: it asks make whether each marker file below is
# current (`make -q`), builds it with its output in .venv/setup.log, and on failure prints
# that log's last lines. A missing or wrong tool is one line naming what to install.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup test-setup integration-setup demo test test-integration lint typecheck unit ui bench soak docs clean \
	lint-checks typecheck-checks unit-tests

setup:
	@PYTHON='$(PYTHON)' scripts/setup demo

test-setup:
	@PYTHON='$(PYTHON)' scripts/setup test

integration-setup: test-setup
	@scripts/setup integration

# The set-up steps' markers (scripts/setup builds them in this order). The packages go in with
# uv (pinned in constraints.txt): the same pins as pip would install, in a third of pip's time.
# Compiled to bytecode as they go in: uv writes no .pyc otherwise, and with
# PYTHONDONTWRITEBYTECODE=1 every command would compile PySpark and Dagster again (~7 s).
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -c constraints.txt uv
	$(BIN)/uv pip install --compile-bytecode --python $(BIN)/python -c constraints.txt -e '.[dev,connect]'
	touch $@

jvm/lib/.pom.sha: jvm/pom.xml jvm/fetch-jars $(VENV)/.installed
	PYTHON=$(BIN)/python jvm/fetch-jars jvm --spark

$(VENV)/.smoke: jvm/lib/.pom.sha
	$(BIN)/python -m lowmark.state.smoke
	touch $@

jvm/kafka/lib/.pom.sha: jvm/kafka/pom.xml jvm/fetch-jars
	jvm/fetch-jars jvm/kafka

# S3A (hadoop-aws and the AWS SDK bundle, ~690 MB) for checkpoints and sinks on object
# storage (docs/deploy.md, "Object storage"), and lowmark's Delta log store for S3 (built
# from jvm/s3/src against them); `make integration-setup` fetches and builds them.
jvm/s3/lib/.pom.sha: jvm/s3/pom.xml jvm/fetch-jars jvm/s3/build-log-store \
		$(wildcard jvm/s3/src/dev/lowmark/delta/*.java) jvm/lib/.pom.sha
	jvm/fetch-jars jvm/s3
	PYTHON=$(BIN)/python jvm/s3/build-log-store

# The Dagster UI on http://127.0.0.1:3000 (LOWMARK_UI_PORT) with the project's instance
# (SQLite in .dagster_home). Ctrl-C stops the webserver, daemon, code server and runs.
ui: setup
	$(BIN)/lowmark ui

demo: setup
	$(BIN)/lowmark demo
	$(BIN)/lowmark status user_revenue

lint: setup
	@$(MAKE) --no-print-directory lint-checks

typecheck: setup
	@$(MAKE) --no-print-directory typecheck-checks

unit: test-setup
	@$(MAKE) --no-print-directory unit-tests

# `make test`: the set-up once, then lint and mypy beside the tests (they take about a minute
# and a half of one core; the tests 13 minutes). The tests print as they go; each check prints
# its output in one piece when it ends. Any of them failing fails `make test`.
test: test-setup
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint-checks typecheck-checks & checks=$$!; \
	$(MAKE) --no-print-directory unit-tests; tests=$$?; \
	wait $$checks && exit $$tests

# The checks themselves, without the set-up (the targets above run it first).
lint-checks:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck-checks:
	$(BIN)/mypy

# Two workers (pytest-xdist; see docs/development.md). The 15 slowest tests are listed at the
# end: where the suite's time goes (goal: 15 minutes).
unit-tests:
	$(BIN)/pytest -m "not integration" -n 2 --dist loadgroup --no-loadscope-reorder --durations=15

# What `make test` leaves out to keep it under 15 minutes on 2 cores (tests marked
# `integration`, listed in docs/development.md): the rest of the kill matrix and of the generated
# fault matrix (tests/faults/matrix.py: `make test` runs its covering slice), the random crash
# schedules and the compactions between kill and replay over the other pipelines, real
# `dagster dev` with the browser, the CLI end to end in subprocesses, the installed wheel, long
# histories and long runs' job counts. Run it before a release; on two workers like `make unit`.
test-integration: integration-setup
	$(BIN)/pytest -m integration -n 2 --dist loadgroup --no-loadscope-reorder --durations=15

# Random crash schedules with real SIGKILLs of `lowmark run` (tests/faults/soak.py);
# prints `cases: N, differences: D` and fails if D > 0.
SOAK_SCHEDULES ?= 12
SOAK_SEED ?= 0
soak: test-setup
	$(BIN)/python -m tests.faults.soak --schedules $(SOAK_SCHEDULES) --seed $(SOAK_SEED)

# Small-batch time with 10 k vs 1 M open windows, before and after lowmark's maintenance,
# lowmark vs Structured Streaming (bench/state_scaling.py), then lowmark vs Structured Streaming vs a plain Spark job
# on the same data (bench/streaming.py, which includes the first one's output as (c)
# and writes bench/RESULTS.md), the catch-up read-ahead's job next to one wide Structured
# Streaming trigger and a plain job in one warm JVM (bench/read_ahead_job.py), a long
# history (bench/history.py) and the file-to-sink latency through dagster dev (bench/dagster_latency.py), a windowed pipeline over Kafka
# next to Structured Streaming's Kafka source (bench/kafka.py), deduplication by record id
# next to Structured Streaming's dropDuplicatesWithinWatermark (bench/dedup.py), and a keyed
# step with timers next to Structured Streaming's transformWithStateInPandas (bench/keyed_state.py),
# a stream-stream join next to Structured Streaming's stream-stream join (bench/stream_join.py),
# the two watermark strategies on the same out-of-order data (bench/watermark_strategies.py),
# and rows/s into Postgres next to Structured Streaming's foreachBatch + JDBC (bench/postgres_sink.py,
# with PostgreSQL's JDBC driver from jvm/bench/pom.xml).
# BENCH_ARGS=--quick for a smoke run of bench/state_scaling.py, bench/streaming.py (no
# RESULTS.md), bench/read_ahead_job.py, bench/dedup.py, bench/keyed_state.py and
# bench/stream_join.py.
# Never part of `make test`.
BENCH_ARGS ?=
BENCH_OUT := data/bench
bench: test-setup
	mkdir -p $(BENCH_OUT)
	bash -o pipefail -c '$(BIN)/python -m bench.state_scaling $(BENCH_ARGS) | tee $(BENCH_OUT)/state_scaling.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.state_scaling --spread $(BENCH_ARGS) | tee $(BENCH_OUT)/state_scaling_spread.txt'
	$(BIN)/python -m bench.streaming $(BENCH_ARGS) --state-scaling-log $(BENCH_OUT)/state_scaling.txt
	bash -o pipefail -c '$(BIN)/python -m bench.late_catch_up | tee $(BENCH_OUT)/late_catch_up.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.read_ahead_job $(BENCH_ARGS) | tee $(BENCH_OUT)/read_ahead_job.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.history --batches 600 --every 200 | tee $(BENCH_OUT)/history.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.looks | tee $(BENCH_OUT)/looks.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.dagster_latency | tee $(BENCH_OUT)/dagster_latency.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.kafka | tee $(BENCH_OUT)/kafka.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.dedup $(BENCH_ARGS) | tee $(BENCH_OUT)/dedup.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.keyed_state $(BENCH_ARGS) | tee $(BENCH_OUT)/keyed_state.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.stream_join $(BENCH_ARGS) | tee $(BENCH_OUT)/stream_join.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.distributed $(BENCH_ARGS) | tee $(BENCH_OUT)/distributed.txt'
	bash -o pipefail -c '$(BIN)/python -m bench.watermark_strategies | tee $(BENCH_OUT)/watermark_strategies.txt'
	jvm/fetch-jars jvm/bench
	bash -o pipefail -c '$(BIN)/python -m bench.postgres_sink | tee $(BENCH_OUT)/postgres_sink.txt'

# The docs site (mkdocs.yml, docs/) into site/: first the configuration reference is generated
# again from the pipeline models (scripts/config_reference.py), then `mkdocs build --strict`
# fails on any warning, a broken link or anchor included. Needs only the venv.
docs: $(VENV)/.installed
	$(BIN)/python -m scripts.config_reference
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) jvm/lib jvm/kafka/lib jvm/bench/lib jvm/s3/lib data .dagster_home site
