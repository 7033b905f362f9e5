"""A Spark write's commit finds the files of failed task attempts through the instant's markers
(``engine/layout/markers.py``), so its object-store listings do not grow with the partitions
the batch wrote; and a task attempt killed after it began a file still leaves nothing at the
commit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine import Table
from engine.format.naming import parse_base_file, parse_log_file
from ingest.sink import HudiStreamingSink, SinkConfig
from ingest.spark_write import InstantPlan
from tests.helpers import hudi_rs_read, rows_by_key
from tests.ingest.helpers import ROW, Event, EventOracle, decoder, kafka_rows
from tests.s3 import S3Location
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

PARTITIONS = 12
"""Partitions of the listing test's table. A commit that listed each partition it wrote would
list 12 folders for the batch that writes every partition and 1 for the batch that writes
one (40 partitions before: the same difference, three times the writes on the S3 server)."""
CITIES = [f"c{i:02d}" for i in range(PARTITIONS)]
ROOT = Path(__file__).resolve().parents[2]


def _events(batch: int, cities: Sequence[str]) -> list[Event]:
    return [Event(f"{city}-{i}", ts=batch * 10 + 1, city=city, fare=float(batch))
            for city in cities for i in range(2)]


@pytest.fixture
def commit_requests(monkeypatch: pytest.MonkeyPatch
                    ) -> Iterator[Callable[[list[tuple[str, str]]], list[list[tuple[str, str]]]]]:
    """Wraps the real :meth:`InstantPlan.finish` (the Spark write's commit) so that the
    requests the S3 server logged while each commit ran are kept, one list per commit."""
    commits: list[list[tuple[str, str]]] = []
    seen: list[list[tuple[str, str]]] = []
    real = InstantPlan.finish

    def finish(self: InstantPlan, *args: Any, **kwargs: Any) -> Any:
        start = len(seen[0])
        try:
            return real(self, *args, **kwargs)
        finally:
            commits.append(list(seen[0][start:]))

    monkeypatch.setattr(InstantPlan, "finish", finish)

    def watch(requests: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
        seen[:] = [requests]
        commits.clear()
        return commits

    yield watch


@pytest.mark.spark
def test_spark_commit_lists_on_s3_do_not_grow_with_partitions_written(
        spark: Any, s3: S3Location,  # noqa: F811
        commit_requests: Callable[[list[tuple[str, str]]], list[list[tuple[str, str]]]]
        ) -> None:
    lists: dict[int, list[str]] = {}
    for written in (1, PARTITIONS):
        path = s3.uri(f"t{written}")
        sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id",
                                            precombine="ts", partition_by=["city"],
                                            storage_options=s3.storage_options))
        oracle, offsets = EventOracle(), {0: 0}
        # The same table both times (every partition written once), then a batch that
        # writes 1 partition or all of them.
        for batch, cities in enumerate((CITIES, CITIES[:written])):
            events = _events(batch, cities)
            with s3.server.requests(s3.bucket) as seen:
                commits = commit_requests(seen)
                sink.process_batch(spark.createDataFrame(kafka_rows(events, "t", offsets)),
                                   batch)
            oracle.apply(events)
        assert len(commits) == 1
        lists[written] = [prefix for kind, prefix in commits[0] if kind == "LIST"]
        table = Table.open(path, storage_options=s3.storage_options)
        assert rows_by_key(table.read(columns=["id", *ROW]), "id", ROW, once=True) \
            == oracle.rows
        assert rows_by_key(hudi_rs_read(path, storage_options=s3.storage_options),
                           "id", ROW) == oracle.rows
        # the instant's markers are gone with the commit
        assert not [k for k in s3.server.objects(s3.bucket)
                    if k.startswith(f"t{written}/.hoodie/.temp/")]
    assert len(lists[1]) == len(lists[PARTITIONS]), lists
    assert not [p for p in lists[PARTITIONS] if p.rstrip("/").rpartition("/")[2] in CITIES], lists


# Executor side, in the child job's Python workers: the first write task attempt that
# publishes a data file once the job armed the kill records the file's path and SIGKILLs its
# worker, so Spark retries the task (``local[2,2]``: 2 attempts per task).
SITECUSTOMIZE = textwrap.dedent("""
    import importlib.abc, importlib.machinery, os, signal, sys
    WORK = os.environ.get("TIDELAKE_TEST_KILL_WRITE")

    def arm(module):
        original = module.execute
        def execute(ctx, task, *args, **kwargs):
            stat = original(ctx, task, *args, **kwargs)
            if task.attempt == 0 and os.path.exists(os.path.join(WORK, "armed")):
                try:
                    fd = os.open(os.path.join(WORK, "killed"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    return stat
                os.write(fd, stat.path.encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
            return stat
        module.execute = execute

    class AfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "engine.write.group_writer":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                arm(module)
            spec.loader.exec_module = exec_module
            return spec

    if WORK:
        sys.meta_path.insert(0, AfterImport())
""")

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from pyspark.sql import SparkSession
    from ingest.sink import HudiStreamingSink, SinkConfig
    from tests.ingest.helpers import decoder, kafka_rows
    from tests.ingest.test_commit_markers import CITIES, _events
    work = Path(sys.argv[1])
    spark = (SparkSession.builder.master("local[2,2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    sink = HudiStreamingSink(SinkConfig(str(work / "t"), decoder=decoder(), record_key="id",
                                        precombine="ts", partition_by=["city"]))
    offsets = {0: 0}
    for batch, cities in enumerate((CITIES[:4], CITIES[:4])):
        if batch == 1:
            (work / "armed").touch()
        sink.process_batch(spark.createDataFrame(kafka_rows(_events(batch, cities), "t",
                                                            offsets)), batch)
    print("BATCHES DONE", flush=True)
    spark.stop()
""")


@pytest.mark.spark
@pytest.mark.slow
def test_spark_task_attempt_killed_after_writing_its_file_leaves_nothing_at_commit(
        tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, TIDELAKE_TEST_KILL_WRITE=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(site)]),
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "BATCHES DONE" in proc.stdout, proc.stdout + proc.stderr
    killed = (tmp_path / "killed").read_text()
    path = str(tmp_path / "t")
    folder, _, name = killed.rpartition("/")
    parsed = parse_base_file(name) or parse_log_file(name)
    assert parsed is not None and parsed.write_token.endswith("-0"), killed
    assert not Path(path, killed).exists(), f"the killed attempt's {killed} survived the commit"
    retried = [p.name for p in Path(path, folder).iterdir()
               if (found := parse_base_file(p.name) or parse_log_file(p.name)) is not None
               and found.file_id == parsed.file_id and found.instant_time == parsed.instant_time]
    assert len(retried) == 1 and retried[0].endswith(
        ("-1", "-1_" + parsed.instant_time + ".parquet")), retried  # Spark's second attempt
    table = Table.open(path)
    timeline = table.timeline()
    assert [e.state for e in timeline] == ["completed"] * len(timeline)
    assert not list(Path(path, ".hoodie", ".temp").glob("*"))
    oracle = EventOracle()
    for batch in range(2):
        oracle.apply(_events(batch, CITIES[:4]))
    assert rows_by_key(table.read(columns=["id", *ROW]), "id", ROW, once=True) == oracle.rows
    assert rows_by_key(hudi_rs_read(path), "id", ROW) == oracle.rows
    # every data file left is one the timeline committed
    leftovers = [p.name for p in Path(path).rglob("*")
                 if p.is_file() and ".hoodie" not in p.parts and ".tmp." in p.name]
    assert leftovers == []
