"""The streaming sink when a table service holds the table lock past the writer's wait.

A "service" here is another holder of the table's file-system lock (as compaction's or
clustering's commit step is) that keeps it longer than the sink's
``hoodie.write.lock.wait_time_ms``: while the sink starts its instant, or between its write
tasks and its commit. The sink must wait again instead of failing the query (bounded by
``conflict_retries``), commit the batch exactly once, and leave no instant pending.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import ingest.sink as sink_module
from engine import Table
from engine.errors import LockTimeoutError
from engine.storage import Storage
from engine.timeline.lock import FileSystemLock
from ingest.sink import HudiStreamingSink, SinkConfig
from tests.ingest.helpers import Event, EventOracle, decoder, kafka_rows, table_rows
from tests.ingest.job_harness import pending_instants
from tests.spark_session import spark  # noqa: F401

WAIT_MS = 300
"""The sink's lock wait; the service holds the lock several times as long."""

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


@contextmanager
def service_holding_lock(path: str, seconds: float | None) -> Iterator[threading.Event]:
    """Another holder of the table lock from now on, for ``seconds`` or (None) until the
    yielded event is set."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with FileSystemLock(Storage(path), wait_seconds=30, expire_seconds=60):
            held.set()
            release.wait(seconds if seconds is not None else 120)

    thread = threading.Thread(target=hold, name="service")
    thread.start()
    assert held.wait(30)
    try:
        yield release
    finally:
        if seconds is None:
            release.set()
        thread.join(150)


def _sink(path: str, **kwargs: Any) -> HudiStreamingSink:
    return HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"], num_buckets=1, services=False,
                                        options={"hoodie.write.lock.wait_time_ms": str(WAIT_MS)},
                                        **kwargs))


def _rollbacks(path: str) -> int:
    return sum(e.action == "rollback" for e in Table.open(path).timeline())


@pytest.mark.spark
def test_sink_lock_busy_at_begin_waits_again_and_commits_once(
        spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    sink = _sink(path)
    oracle, offsets = EventOracle(), dict[int, int]()
    first = [Event("a", 10, "oslo", 1.0)]
    sink.process_batch(spark.createDataFrame(kafka_rows(first, "ev", offsets)), 0)
    oracle.apply(first)
    second = [Event("a", 20, "oslo", 2.0), Event("b", 20, "oslo", 3.0)]
    with caplog.at_level("WARNING", logger="ingest.sink"), \
            service_holding_lock(path, seconds=4 * WAIT_MS / 1000):
        sink.process_batch(spark.createDataFrame(kafka_rows(second, "ev", offsets)), 1)
    oracle.apply(second)
    assert sink.totals.retries >= 1
    assert any("starting it again" in r.getMessage() for r in caplog.records)
    assert table_rows(path) == oracle.rows
    assert pending_instants(path) == [] and _rollbacks(path) == 0  # nothing was started


@contextmanager
def service_after_write_tasks(path: str, seconds: float | None) -> Iterator[list[Any]]:
    """Right after the sink's tasks wrote the batch's files (before its commit), a service
    takes the table lock (for ``seconds``, or until the yielded list's event is set)."""
    original = sink_module.write_rows
    holders: list[Any] = []

    def write_rows(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if not holders:
            holding = service_holding_lock(path, seconds)
            holders.append((holding, holding.__enter__()))
        return result

    sink_module.write_rows = write_rows
    try:
        yield holders
    finally:
        sink_module.write_rows = original
        for holding, _ in holders:
            holding.__exit__(None, None, None)


@pytest.mark.spark
def test_sink_lock_busy_at_commit_commits_the_same_instant_again(
        spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    sink = _sink(path)
    oracle, offsets = EventOracle(), dict[int, int]()
    first = [Event("a", 10, "oslo", 1.0)]
    sink.process_batch(spark.createDataFrame(kafka_rows(first, "ev", offsets)), 0)
    oracle.apply(first)
    second = [Event("a", 20, "oslo", 2.0), Event("b", 20, "oslo", 3.0)]
    with caplog.at_level("WARNING", logger="ingest.sink"), \
            service_after_write_tasks(path, seconds=4 * WAIT_MS / 1000) as holders:
        sink.process_batch(spark.createDataFrame(kafka_rows(second, "ev", offsets)), 1)
    assert holders  # the service did hold the lock at commit time
    oracle.apply(second)
    assert sink.totals.retries >= 1
    assert any("committing instant" in r.getMessage() and "again" in r.getMessage()
               for r in caplog.records)
    assert table_rows(path) == oracle.rows
    # The instant started was the one committed: written once, never rolled back.
    assert pending_instants(path) == [] and _rollbacks(path) == 0


@pytest.mark.spark
def test_sink_lock_busy_beyond_retries_fails_then_next_batch_rolls_it_back(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    sink = _sink(path, conflict_retries=1)
    oracle, offsets = EventOracle(), dict[int, int]()
    first = [Event("a", 10, "oslo", 1.0)]
    sink.process_batch(spark.createDataFrame(kafka_rows(first, "ev", offsets)), 0)
    oracle.apply(first)
    second = [Event("a", 20, "oslo", 2.0), Event("b", 20, "oslo", 3.0)]
    rows = kafka_rows(second, "ev", offsets)
    with service_after_write_tasks(path, seconds=None) as holders:
        with pytest.raises(LockTimeoutError,
                           match="still waiting for the table lock after 1 retries"):
            sink.process_batch(spark.createDataFrame(rows), 1)
        assert holders
        # Its rollback could not take the lock either: the instant is left inflight...
        assert [p.split()[2] for p in pending_instants(path)] == ["inflight"]
    assert table_rows(path) == oracle.rows
    # ...until the service ended: the replayed batch rolls it back first.
    sink.process_batch(spark.createDataFrame(rows), 1)
    oracle.apply(second)
    assert table_rows(path) == oracle.rows
    assert pending_instants(path) == [] and _rollbacks(path) == 1
