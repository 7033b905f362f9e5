#!/usr/bin/env bash
# Create .venv (if missing) and install tidelake with its test and dev tools into it.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Azurite (npm), the Azure Storage emulator the object-store tests start (tests/azure.py),
# installed beside pip's install (on a fresh clone each takes ~45-60 s, mostly waiting on the
# network and the disk: one after the other they were ~100 s of the ~127 s setup).
azurite=""
if [ ! -x node_modules/.bin/azurite-blob ]; then
  npm install --no-save --no-package-lock --no-audit --no-fund --loglevel=error azurite@3.37.0 &
  azurite=$!
fi
stamp=.venv/.tidelake-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  touch "$stamp"
fi
if [ -n "$azurite" ]; then
  wait "$azurite"  # its failure fails the setup, as before
fi
# The class-data archive every Spark driver JVM of a job maps (jobs/spark_jvm.py): written once
# per Java and Spark install by one small demo run (about a minute), it halves the JVM's part of
# a job's start. scripts/test.sh writes it itself, beside the engine's quick tests.
if [ -z "${TIDELAKE_SETUP_SKIP_JVM_ARCHIVE:-}" ]; then
  .venv/bin/python -m jobs.spark_jvm
fi
