#!/usr/bin/env bash
# The project's test command: set up, lint, type-check, then the quick suite and the slow one.
# `--soak` (or TIDELAKE_SOAK=1) runs the repeated random rounds at their full size
# (docs/testing.md); other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--soak" ]; then
  export TIDELAKE_SOAK=1
  shift
fi
phase() { echo "test.sh: $1 done at ${SECONDS} s"; }  # where a run's time goes
# The JVM archive is written below, beside the engine's quick tests, not by setup.
TIDELAKE_SETUP_SKIP_JVM_ARCHIVE=1 bash scripts/setup.sh
# Bytecode for the project's modules, written once: where PYTHONDONTWRITEBYTECODE is set (as
# on the machines of docs/testing.md) every Python process the tests start — each job's
# driver, Spark's Python workers, the engine tests' writer processes — would otherwise compile
# every module it imports (~0.3 CPU s each). Python still checks each file against its source.
.venv/bin/python -m compileall -q engine ingest jobs tests bench > /dev/null
phase "setup"
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/mypy bench/  # scripts, not a package (bench/ingest.py would shadow ingest)
# The engine's layers and the packages' circles (pyproject.toml's import-linter contracts,
# docs/layers.md): a new upward import or circle fails here with its file and line.
.venv/bin/lint-imports --no-cache
# circles, upward imports, and ingest's engine modules (fails above 12: docs/engine.md)
.venv/bin/python scripts/import_graph.py
phase "ruff, mypy and lint-imports"
# The class-data archive the tests' Spark JVMs start from (tests/spark_jvm.py): written once
# per Java and Spark install (about a minute and a half, beside the engine's quick tests, which
# start no JVM); it halves each JVM's start.
.venv/bin/python -m tests.spark_jvm &
archive=$!
# Quick subset first (fails fast), then everything marked slow. The engine's quick tests need
# no JVM and run on two workers (pytest-xdist; docs/testing.md has the measurement); the rest
# share one Spark session and one broker per process and run in one. With arguments (paths,
# -k ...) the quick suite runs in one process, as given.
if [ "$#" -eq 0 ]; then
  .venv/bin/python -m pytest -m "not slow" -q --durations=10 -n 2 tests/engine
  phase "the engine's quick suite"
  wait "$archive"
  phase "the JVM archive"
  .venv/bin/python -m pytest -m "not slow" -q --durations=10 --ignore=tests/engine
else
  wait "$archive"
  .venv/bin/python -m pytest -m "not slow" -q "$@"
fi
phase "the quick suite"
status=0
.venv/bin/python -m pytest -m slow -q --durations=20 "$@" || status=$?
phase "the slow suite"
# Exit code 5 means "no test selected": not a failure when no suite is marked slow.
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
