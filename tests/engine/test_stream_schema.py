"""The rule a running stream's batches are checked by (engine/read/stream_schema.py): a commit
that changed the table's schema in a way the stream's schema cannot carry is refused, naming
it; changes the stream's schema already carries (a query restarted after them) pass."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import SchemaChangedError
from engine.read.stream_schema import check_stream_schema, schema_change
from engine.timeline.active import Timeline, completion_key

V1 = pa.schema([("key", pa.string()), ("n", pa.int32())])
ADDED = pa.schema([("key", pa.string()), ("n", pa.int32()), ("extra", pa.string())])
WIDENED = pa.schema([("key", pa.string()), ("n", pa.int64())])
DROPPED = pa.schema([("key", pa.string())])
RENAMED = pa.schema([("key", pa.string()), ("m", pa.int32())])


def test_schema_change_names_what_a_stream_would_lose() -> None:
    assert schema_change(V1, ADDED, V1) == ("extra", "was added (type string)")
    assert schema_change(V1, WIDENED, V1) == ("n", "changed type from int32 to int64")
    assert schema_change(V1, DROPPED, V1) == ("n", "was dropped or renamed")
    assert schema_change(V1, RENAMED, V1) == ("m", "was added (type int32)")
    assert schema_change(V1, V1, V1) is None


def test_schema_change_passes_what_the_stream_already_carries() -> None:
    # a query restarted after the change reads it (older commits: nulls, widened values)
    assert schema_change(V1, ADDED, ADDED) is None
    assert schema_change(V1, WIDENED, WIDENED) is None
    assert schema_change(V1, DROPPED, DROPPED) is None
    # the baseline of a stream from the first commit is its own schema: no drops judged
    assert schema_change(ADDED, V1, ADDED, drops=False) is None
    assert schema_change(WIDENED, V1, WIDENED, drops=False) is None
    # a column the stream's (user-given) schema leaves out and no commit changed
    assert schema_change(ADDED, ADDED, V1) is None


def test_check_stream_schema_on_a_table_refuses_the_commit_that_added_a_column(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="key")
    first = table.upsert(pa.table({"key": ["a"], "n": pa.array([1], pa.int32())}))
    stream = table.read_schema()
    added = table.upsert(pa.table({"key": ["b"], "n": pa.array([2], pa.int32()),
                                   "extra": ["x"]}))
    timeline = Timeline.load(table.storage, table.config)
    done = {i.requested_time: completion_key(i) for i in timeline.completed_data_instants}
    check_stream_schema(timeline, None, done[first], stream)
    for start in (None, done[first]):
        with pytest.raises(SchemaChangedError, match=f"instant {added}") as caught:
            check_stream_schema(timeline, start, done[added], stream)
        assert (caught.value.instant, caught.value.column) == (added, "extra")
    check_stream_schema(timeline, done[first], done[added], table.read_schema())
    check_stream_schema(timeline, None, done[added], table.read_schema())
