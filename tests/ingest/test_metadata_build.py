"""A metadata-table index built for an existing table runs in Spark tasks when a
SparkSession drives the writer (one task per file slice), and builds the same index."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.metadata.reader import read_slice
from engine.metadata.record_index import RECORD_INDEX, group_slices
from engine.metadata.records import RecordIndexInfo
from engine.metadata.table import MetadataTable, declared_partitions
from engine.timeline.active import Timeline
from engine.write.write_client import WriteClient
from ingest.services import spark_runner
from tests.engine.helpers import SCHEMA, random_batch
from tests.helpers import Oracle
from tests.spark_session import spark  # noqa: F401


def _entries(table: Table) -> dict[str, tuple[str, str]]:
    timeline = Timeline.load(table.storage, table.config)
    mdt = MetadataTable(table.storage, table.config)
    out = {}
    for piece in group_slices(table.storage, timeline):
        for key, record in read_slice(mdt.storage, piece).items():
            assert isinstance(record.payload, RecordIndexInfo)
            out[key] = (record.payload.partition_name or "", record.payload.location_file_id)
    return out


def test_record_index_build_for_existing_table_runs_in_spark_tasks(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by=["region"],
                         options={"hoodie.index.type": "GLOBAL_SIMPLE"})
    rng, oracle, counter = random.Random(5), Oracle(), [0]
    for _ in range(3):
        batch = random_batch(rng, oracle, counter, 40)
        oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA)))
    slices = len(table.file_slices())
    assert slices >= 2
    enabled = Table.open(table.path, {"hoodie.metadata.record.index.enable": "true"})
    client = WriteClient(enabled.storage, enabled.config, enabled.write_config)
    runs: list[int] = []
    inner = spark_runner(spark, 2)

    def counting(fn: Any, tasks: Any) -> Any:
        runs.append(len(tasks))
        return inner(fn, tasks)

    client.task_runner = counting  # as the streaming job's writer has (ingest/spark_write.py)
    monkeypatch.setattr(Table, "_client", lambda self, timeline=None: client)
    batch = random_batch(rng, oracle, counter, 10)
    oracle.upsert(batch, enabled.upsert(pa.Table.from_pylist(batch, schema=SCHEMA)))
    assert RECORD_INDEX in declared_partitions(table.storage)
    assert runs == [slices]  # one Spark task per file slice of the table
    expected = {row["_hoodie_record_key"]: (row["_hoodie_partition_path"],
                                            row["_hoodie_file_name"].split("_")[0])
                for row in enabled.read().to_pylist()}
    assert _entries(enabled) == expected
    assert len(expected) == len(oracle.rows)
