"""The sink's table services live as long as the query ``start_ingest`` started
(``ingest/services.py``, ``StreamingServices.follow_query``): ``query.stop()`` stops the
service thread after the step in progress, quietly, leaving pending plans to the next run,
which executes them as soon as it starts."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import engine.services.clean as clean_module
from ingest.sink import HudiStreamingSink, SinkConfig, start_ingest
from tests.ingest.helpers import (
    Event,
    EventOracle,
    ParquetStream,
    decoder,
    hudi_rs_rows,
    random_batches,
    table_rows,
)
from tests.ingest.job_harness import pending_instants
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {
    "hoodie.compact.inline.max.delta.commits": "2",
    "hoodie.cleaner.commits.retained": "2",
    "tidelake.services.max.pending.compactions": "50",  # no back-pressure wait here
}


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds passed (a bound, not a
    measurement)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def _sink(path: str) -> HudiStreamingSink:
    return HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id",
                                        precombine="ts", partition_by=["city"],
                                        num_buckets=2, options=OPTIONS))


def _compactions(path: str) -> list[str]:
    return [p for p in pending_instants(path) if " compaction " in p]


def _events(seed: int) -> list[list[Event]]:
    """Four micro-batches of 30 upserts (Kafka partition 0)."""
    return [[Event(e.id, e.ts, e.city, e.fare, e.delete) for e in events]
            for events in random_batches(random.Random(seed), 4, 30, moves=False,
                                         tombstones=False, clock=[0])]


@pytest.mark.spark
def test_query_stop_ends_services_after_step_in_progress_next_start_resumes_plan(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    path = str(tmp_path / "trips")
    # The service thread's clean (its first step, after the first batch) waits for a gate:
    # the step in progress when the query stops.
    original, gate, entered = clean_module.run_clean, threading.Event(), threading.Event()

    def gated_clean(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        gate.wait(timeout=120)
        return original(*args, **kwargs)

    monkeypatch.setattr(clean_module, "run_clean", gated_clean)
    stream, oracle = ParquetStream(tmp_path, "trips"), EventOracle()
    for events in _events(5):
        stream.add(events)
        oracle.apply(events)
    sink = _sink(path)
    query = start_ingest(spark, stream.frame(spark), sink, str(tmp_path / "ck"),
                         trigger="1 second")
    try:
        query.processAllAvailable()  # 4 micro-batches: a compaction is due and planned
        assert entered.wait(120), "the service thread never reached its clean"
        planned = _compactions(path)
        assert planned, pending_instants(path)
    finally:
        query.stop()
    assert _wait(lambda: any("table services stop after the step in progress" in r.message
                             for r in caplog.records), 60), "the query's end reached no service"
    gate.set()  # the step in progress ends; nothing after it runs
    assert _wait(lambda: sink.services.stopped, 60), sink.services.state.describe()
    assert _compactions(path) == planned, "a service ran after the query stopped"
    assert sink.services.state.services["compaction"].done == 0
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows

    # The next run (a restarted job: a new sink) executes the pending plan at once, though
    # no record is left to read.
    monkeypatch.setattr(clean_module, "run_clean", original)
    restarted = _sink(path)
    query = start_ingest(spark, stream.frame(spark), restarted, str(tmp_path / "ck"),
                         trigger="1 second")
    try:
        assert _wait(lambda: not _compactions(path), 300), pending_instants(path)
    finally:
        query.stop()
    assert _wait(lambda: restarted.services.stopped, 120)
    assert restarted.services.state.services["compaction"].done == len(planned)
    assert not pending_instants(path)
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]


# A job that stops its session right after the query (what ``tidelake ingest`` does) while
# the service thread is about to run a compaction: the compaction's Spark job meets a
# stopped SparkContext. Its own process: the shared test session must stay up.
CHILD = textwrap.dedent("""
    import logging, sys, threading, time
    from pathlib import Path
    logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(name)s %(message)s")
    from pyspark.sql import SparkSession
    import engine.services.compaction as compaction_module
    from ingest.sink import HudiStreamingSink, SinkConfig, start_ingest
    from tests.ingest.helpers import ParquetStream, decoder
    from tests.ingest.test_services_query_life import OPTIONS, _events
    work = Path(sys.argv[1])
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    entered, gate = threading.Event(), threading.Event()
    original = compaction_module.run_compaction
    def gated(*args, **kwargs):
        entered.set()
        gate.wait(120)
        return original(*args, **kwargs)
    compaction_module.run_compaction = gated
    stream = ParquetStream(work, "trips")
    for events in _events(5):
        stream.add(events)
    sink = HudiStreamingSink(SinkConfig(str(work / "trips"), decoder=decoder(),
                                        record_key="id", precombine="ts",
                                        partition_by=["city"], num_buckets=2,
                                        options=OPTIONS))
    query = start_ingest(spark, stream.frame(spark), sink, str(work / "ck"),
                         trigger="1 second")
    query.processAllAvailable()
    assert entered.wait(120), "no compaction started"
    query.stop()
    spark.stop()
    gate.set()
    def ended():  # (the thread itself: what StreamingServices.stopped reports)
        thread = sink.services._thread
        return thread is None or not thread.is_alive()
    deadline = time.monotonic() + 120
    while not ended() and time.monotonic() < deadline:
        time.sleep(0.2)
    print("SERVICES STOPPED", ended(), flush=True)
""")


@pytest.mark.spark
@pytest.mark.slow
def test_session_stopped_under_a_service_logs_one_line_plan_resumed_by_next_run(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "SERVICES STOPPED True" in proc.stdout, output
    assert "Traceback" not in output and "stopped SparkContext" not in output, output
    ours = [line for line in output.splitlines()
            if line.startswith(("LOG WARNING ingest", "LOG ERROR ingest",
                                "LOG WARNING engine", "LOG ERROR engine"))]
    assert not ours, ours
    assert "compaction stopped with the query" in output, output
    path = str(tmp_path / "trips")
    planned = _compactions(path)
    assert planned, pending_instants(path)
    oracle = EventOracle()
    for events in _events(5):
        oracle.apply(events)
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows

    restarted = _sink(path)
    query = start_ingest(spark, ParquetStream(tmp_path, "trips").frame(spark), restarted,
                         str(tmp_path / "ck"), trigger="1 second")
    try:
        assert _wait(lambda: not _compactions(path), 300), pending_instants(path)
    finally:
        query.stop()
    assert _wait(lambda: restarted.services.stopped, 120)
    assert not pending_instants(path)
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows
