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
# One seed for the run's rotating CI cases (tests/soak.py, docs/testing.md): printed here, and
# named by a failing test; the same value replays the same cases.
export TIDELAKE_ROTATION_SEED="${TIDELAKE_ROTATION_SEED:-$(( (RANDOM << 15 | RANDOM) % 1000000 ))}"
echo "test.sh: TIDELAKE_ROTATION_SEED=${TIDELAKE_ROTATION_SEED}"
# The JVM archive is written below, beside ruff and mypy and the engine's quick tests, not by
# setup.
TIDELAKE_SETUP_SKIP_JVM_ARCHIVE=1 bash scripts/setup.sh
# Bytecode for the project's modules, written once: where PYTHONDONTWRITEBYTECODE is set (as
# on the machines of docs/testing.md) every Python process the tests start — each job's
# driver, Spark's Python workers, the engine tests' writer processes — would otherwise compile
# every module it imports (~0.3 CPU s each). Python still checks each file against its source.
.venv/bin/python -m compileall -q engine ingest jobs tests bench > /dev/null
phase "setup"
# The class-data archive the tests' Spark JVMs start from (tests/spark_jvm.py): written once
# per Java and Spark install (about a minute and a half, beside ruff and mypy, which keep one
# core busy, and the engine's quick tests, which start no JVM); it halves each JVM's start.
.venv/bin/python -m tests.spark_jvm &
archive=$!
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/mypy bench/  # scripts, not a package (bench/ingest.py would shadow ingest)
# The engine's layers and the packages' circles (pyproject.toml's import-linter contracts,
# docs/layers.md): a new upward import or circle fails here with its file and line.
.venv/bin/lint-imports --no-cache
# circles, upward imports, and ingest's engine modules (fails above 12: docs/engine.md)
.venv/bin/python scripts/import_graph.py
phase "ruff, mypy and lint-imports"
# Quick subset first (fails fast), then everything marked slow. With arguments (paths, -k ...)
# both run in one process, as given. Without, in two lanes beside each other
# (docs/testing.md): the engine's tests (no JVM: writers, services, stress), quick then slow,
# in one process beside the rest, whose Spark sessions and job runs keep 1.2-1.5 of the two
# cores busy and wait on each JVM and Python worker start; the rest share one Spark session
# and one broker per process, quick then slow. The engine lane's output follows the rest's;
# either lane's failure fails the run.
status=0
engine_status=0
# Slow Spark-lane tests that the first lane done with its own tests runs, in a process (broker,
# job runs) of its own: on a quiet machine the engine lane, beside the rest of the Spark lane's
# slow suite, whose length was the run's; where the engine lane runs late (a loaded machine),
# the Spark lane after its slow suite, as before (docs/testing.md, *The Spark lane's slow
# suite split*). The Spark lane's slow suite deselects them.
late_slow=(
  "tests/ingest/test_crash.py::test_job_sigkilled_at_every_point_and_random_moments_restarts_to_oracle[GLOBAL_STATE]"
  "tests/ingest/test_crash.py::test_job_sigkilled_at_every_point_and_random_moments_restarts_to_oracle[RECORD_INDEX]"
  "tests/ingest/test_streaming_services.py::test_ingest_job_sigkilled_inside_each_service_restarts_to_oracle"
)
late_claim=$(mktemp -u)  # made (mkdir: atomic) by the lane that runs late_slow
run_late() {  # $1: the lane; returns pytest's code, 0 where the other lane claimed them
  mkdir "$late_claim" 2>/dev/null || return 0
  local rc=0
  .venv/bin/python -m pytest -m slow -q --durations=20 -p no:cacheprovider \
    "${late_slow[@]}" || rc=$?
  phase "late_slow (in the $1 lane)"
  return "$rc"
}
late_status=0
if [ "$#" -eq 0 ]; then
  engine_log=$(mktemp)
  set -m  # the engine lane in a process group of its own: stopped with its writers on exit
  (
    rc=0
    .venv/bin/python -m pytest -m "not slow" -q --durations=10 -p no:cacheprovider \
      tests/engine || rc=$?
    phase "the engine's quick suite (beside the rest)"
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ]; then
      .venv/bin/python -m pytest -m slow -q --durations=10 -p no:cacheprovider tests/engine \
        || rc=$?
      phase "the engine's slow suite (beside the rest)"
    fi
    # Whatever the engine's tests did, unless the Spark lane got there first.
    late=0
    run_late engine || late=$?
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ]; then rc=$late; fi
    exit "$rc"
  ) > "$engine_log" 2>&1 &
  engine=$!
  set +m
  # A failing quick suite ends the run here: the engine lane ends with it.
  trap 'kill -- -"$engine" 2>/dev/null || true; rm -f "$engine_log"; rmdir "$late_claim" \
    2>/dev/null || true' EXIT
  wait "$archive"
  phase "the JVM archive"
  .venv/bin/python -m pytest -m "not slow" -q --durations=10 --ignore=tests/engine
  phase "the quick suite (without the engine's)"
  .venv/bin/python -m pytest -m slow -q --durations=20 --ignore=tests/engine \
    "${late_slow[@]/#/--deselect=}" || status=$?
  phase "the slow suite (without the engine's)"
  run_late Spark || late_status=$?
  wait "$engine" || engine_status=$?
  trap - EXIT
  cat "$engine_log"
  rm -f "$engine_log"
  rmdir "$late_claim"
else
  wait "$archive"
  .venv/bin/python -m pytest -m "not slow" -q "$@"
  phase "the quick suite"
  .venv/bin/python -m pytest -m slow -q --durations=20 "$@" || status=$?
fi
phase "the slow suite"
# Exit code 5 means "no test selected": not a failure when no suite is marked slow.
for rc in "$status" "$engine_status" "$late_status"; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
