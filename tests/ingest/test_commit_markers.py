"""A Spark write's commit finds the files of failed task attempts through the instant's markers
(``engine/layout/markers.py``), so its object-store listings do not grow with the partitions
the batch wrote; and a task attempt killed after it began a file still leaves nothing at the
commit."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from engine import Table
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

CITIES = [f"c{i:02d}" for i in range(40)]


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
    for written in (1, 40):
        path = s3.uri(f"t{written}")
        sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id",
                                            precombine="ts", partition_by=["city"],
                                            storage_options=s3.storage_options))
        oracle, offsets = EventOracle(), {0: 0}
        # The same table both times (every partition written once), then a batch that
        # writes 1 partition or all 40.
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
    assert len(lists[1]) == len(lists[40]), lists
    assert not [p for p in lists[40] if p.rstrip("/").rpartition("/")[2] in CITIES], lists
