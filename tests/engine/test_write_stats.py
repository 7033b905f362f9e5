"""Write stats of merge-on-read appends, as Hudi's HoodieAppendHandle records them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from engine import Table
from engine.config import LogBlockFormat, MergeMode
from engine.schema import PARTITION_PATH, RECORD_KEY, avro_full_schema
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import CommitMetadata
from engine.write.write_handle import execute
from engine.write.write_task import APPEND, WriteContext, WriteTask
from tests.helpers import hudi_rs_read


def _stats(table: Table) -> list[CommitMetadata]:
    timeline = Timeline.load(table.storage, table.config)
    return [timeline.commit_metadata(i) for i in timeline.completed_data_instants]


def test_append_stat_records_slice_base_instant_base_file_and_log_files(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="id", precombine="ts", partition_by=["city"])
    first = table.upsert(pa.table({"id": ["a"], "ts": [1], "city": ["x"]}))
    second = table.upsert(pa.table({"id": ["a"], "ts": [2], "city": ["x"]}))
    third = table.upsert(pa.table({"id": ["a"], "ts": [3], "city": ["x"]}))
    create, append1, append2 = (m.write_stats[0] for m in _stats(table))
    base_name = Path(create.path).name
    assert base_name.endswith(f"_{first}.parquet")
    assert (append1.prev_commit, append1.base_file) == (first, base_name)
    assert (append2.prev_commit, append2.base_file) == (first, base_name)
    log1, log2 = Path(append1.path).name, Path(append2.path).name
    assert f"_{second}.log." in log1 and f"_{third}.log." in log2
    assert append1.log_files == (log1,)
    assert append2.log_files == (log1, log2)
    # Our readers and hudi-rs still read the commits (snapshot and incremental).
    assert table.read().column("ts").to_pylist() == [3]
    assert hudi_rs_read(table.path).column("ts").to_pylist() == [3]
    assert hudi_rs_read(table.path, start=first).column("ts").to_pylist() == [3]
    assert table.read_incremental(first).column("ts").to_pylist() == [3]


def test_append_stat_log_only_slice_has_empty_base_file(tmp_path: Path) -> None:
    data_schema = pa.schema([pa.field("id", pa.string()), pa.field("ts", pa.int64())])
    ctx = WriteContext(storage=Storage(str(tmp_path)), instant_time="20250101000000000",
                       table_name="t", data_schema=data_schema,
                       avro_schema_with_meta=avro_full_schema(data_schema, "t"),
                       merge_mode=MergeMode.EVENT_TIME_ORDERING, ordering_field="ts",
                       ordering_avro_type="long", log_block_format=LogBlockFormat.AVRO)
    records = pa.table({"id": ["a"], "ts": [1], RECORD_KEY: ["a"], PARTITION_PATH: ["p"]})
    older = ".f1-0_20240101000000000.log.1_0-0-0"
    on_slice = execute(ctx, WriteTask(kind=APPEND, partition_path="p", file_id="f1-0",
                                      records=records, deletes=None,
                                      base_instant="20240101000000000", log_files=(older,)))
    assert (on_slice.prev_commit, on_slice.base_file) == ("20240101000000000", "")
    assert on_slice.log_files == (older, Path(on_slice.path).name)
    new_group = execute(ctx, WriteTask(kind=APPEND, partition_path="p", file_id="f2-0",
                                       records=records, deletes=None))
    assert (new_group.prev_commit, new_group.base_file) == ("20250101000000000", "")
    assert new_group.log_files == (Path(new_group.path).name,)


def test_write_totals_count_commits_as_hudi_metrics_do(tmp_path: Path) -> None:
    """WriteTotals of each commit (the numbers the job publishes under Hudi's metric names),
    against what each upsert did: new keys are inserts into new file groups, known keys
    updates of existing ones, deletes counted apart, log files of a slice add up."""
    from engine.timeline.commit_metadata import WriteTotals

    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="id", precombine="ts", partition_by=["city"])
    table.upsert(pa.table({"id": ["a", "b", "c"], "ts": [1, 1, 1], "city": ["x", "x", "y"]}))
    table.upsert(pa.table({"id": ["a", "d"], "ts": [2, 2], "city": ["x", "x"]}))
    table.delete(pa.table({"id": ["b"], "ts": [3], "city": ["x"]}))
    create, update, delete = (WriteTotals.of(m.write_stats) for m in _stats(table))
    assert (create.partitions_written, create.files_insert, create.files_update) == (2, 2, 0)
    assert (create.records_written, create.insert_records_written,
            create.update_records_written, create.records_deleted) == (3, 3, 0, 0)
    assert create.max_slice_log_files == 0  # base files only
    assert (update.partitions_written, update.files_insert, update.files_update) == (1, 0, 1)
    assert update.records_written == 2 and update.records_deleted == 0
    assert update.max_slice_log_files == 1
    assert (delete.records_deleted, delete.files_update, delete.max_slice_log_files) == (1, 1, 2)
    assert create.bytes_written == sum(
        (tmp_path / "t" / s.path).stat().st_size for s in _stats(table)[0].write_stats)
    assert sorted(table.read().column("id").to_pylist()) == ["a", "c", "d"]
