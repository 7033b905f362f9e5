"""The error (dead-letter) table: Kafka records the sink could not write, with the reason.

A record goes here when its value does not decode, its record key or ordering value is
missing, its partition value cannot be stored, or it is a tombstone whose partition is
unknown. The job goes on; nothing is lost silently.

The error table is itself a tidelake table: copy-on-write, record key ``error_id`` =
``topic-partition-offset`` (unique per Kafka record), partitioned by ``error_date`` (the UTC
date of the record's Kafka timestamp, so a replayed batch lands in the same partition) or not
partitioned, BUCKET index. It holds the raw key and value bytes, the Kafka coordinates, the
batch id, the reason and ``superseded_key`` (the record's key when a later record of it in
the same batch was written: :mod:`ingest.supersede`, for the replay's judgement). The sink
begins the batch's data instant, then writes its error rows as an instant of their own and
commits it *before* it completes the data instant; a replay of the batch rewrites the same
keys with the same content (upsert), and is skipped outright when the error table already
has that batch's commit.

``tidelake errors replay`` (:mod:`ingest.replay`) decodes the rows again with the job's current
settings, writes what now decodes into the table and marks those rows: their ``reason`` then
starts with ``replayed into`` (:func:`ingest.replay.is_replayed`); the rest get their new
reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.config import TableConfig
from engine.errors import TableExistsError, TableNotFoundError
from engine.layout.incoming import key_buckets, partition_paths, record_keys
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.storage import Storage
from engine.table import Table
from ingest.rows import (
    BUCKET,
    ERROR,
    FILE_ID,
    KAFKA_KEY,
    KAFKA_PARTITION,
    OFFSET,
    OP,
    REASON,
    SUPERSEDED,
    TIMESTAMP,
    TOPIC,
    UPSERT,
    VALUE,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ERROR_SCHEMA", "ErrorStaging", "error_rows", "open_error_table", "read_staged",
           "write_schema"]

ERROR_SCHEMA = pa.schema([
    pa.field("error_id", pa.string()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("kafka_key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("batch_id", pa.int64()),
    pa.field("reason", pa.string()),
    pa.field("target_table", pa.string()),
    pa.field("error_date", pa.string()),
    pa.field("superseded_key", pa.string()),
])
"""Data columns of the error table. ``superseded_key`` (added after the others, nullable, so
an error table written before it gains it on its next write and reads null for its older
rows): the record key of a later record of the same micro-batch that the sink wrote, null
when there was none or the record's key could not be told (:mod:`ingest.supersede`)."""

_BOOKKEEPING = [
    pa.field(RECORD_KEY, pa.string()),
    pa.field(PARTITION_PATH, pa.string()),
    pa.field(OP, pa.int8()),
    pa.field(FILE_ID, pa.string()),
    pa.field(TOPIC, pa.string()),
    pa.field(KAFKA_PARTITION, pa.int32()),
    pa.field(OFFSET, pa.int64()),
    pa.field(BUCKET, pa.int32()),
]


def write_schema() -> pa.Schema:
    """Schema of the rows handed to the writer: error columns plus what placement needs."""
    return pa.schema(list(ERROR_SCHEMA) + _BOOKKEEPING)


WRITER_KEY_PREFIXES = ("hoodie.write.lock.", "hoodie.client.heartbeat.")
"""Options of the data table's writer that its error table's writer takes too."""


def open_error_table(path: str, name: str, *, partitioned: bool = True,
                     num_buckets: int = 2, options: Mapping[str, Any] | None = None,
                     storage_options: Mapping[str, str] | None = None) -> Table:
    """Open the error table at ``path``, creating it if missing (driver side). Of
    ``options`` (the data table's writer options) the lock and heartbeat ones apply."""
    writer = {k: v for k, v in (options or {}).items() if k.startswith(WRITER_KEY_PREFIXES)}
    try:
        table = Table.open(path, writer, storage_options=storage_options)
    except TableNotFoundError:
        try:
            return Table.create(
                path, name=name, table_type="COPY_ON_WRITE", record_key="error_id",
                partition_by=["error_date"] if partitioned else None, schema=ERROR_SCHEMA,
                options={"hoodie.index.type": "BUCKET",
                         "hoodie.bucket.index.num.buckets": str(num_buckets), **writer},
                storage_options=storage_options)
        except TableExistsError:  # another job created it meanwhile
            table = Table.open(path, writer, storage_options=storage_options)
    if table.config.record_key_fields != ("error_id",) or table.config.num_buckets is None:
        raise ValueError(f"error_table_path: the table at {path} is not an error table "
                         "(record key error_id, BUCKET index)")
    return table


def error_rows(prepared: pa.Table, *, batch_id: int, target_table: str,
               config: TableConfig) -> pa.Table:
    """Error-table rows of the ``ERROR`` rows of a prepared batch, keyed by ``config``.

    Executor side; pure function of its input, so a replay produces the same rows.
    """
    rows = prepared.filter(pc.equal(prepared.column(OP), ERROR))
    n = rows.num_rows
    topic = rows.column(TOPIC).combine_chunks()
    partition = rows.column(KAFKA_PARTITION).combine_chunks().cast(pa.int32())
    offset = rows.column(OFFSET).combine_chunks().cast(pa.int64())
    stamp = rows.column(TIMESTAMP).combine_chunks().cast(pa.timestamp("us", tz="UTC"))
    error_id = pc.binary_join_element_wise(
        pc.fill_null(topic, ""), partition.cast(pa.string()), offset.cast(pa.string()), "-")
    day = pc.strftime(stamp, format="%Y-%m-%d") if n else pa.array([], pa.string())
    data = pa.table({
        "error_id": error_id,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "kafka_timestamp": stamp,
        "kafka_key": rows.column(KAFKA_KEY).combine_chunks().cast(pa.binary()),
        "value": rows.column(VALUE).combine_chunks().cast(pa.binary()),
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "reason": rows.column(REASON).combine_chunks(),
        "target_table": pa.array([target_table] * n, pa.string()),
        "error_date": day,
        "superseded_key": (rows.column(SUPERSEDED).combine_chunks()
                           if SUPERSEDED in rows.column_names else pa.nulls(n, pa.string())),
    }, schema=ERROR_SCHEMA)
    columns = {f.name: data.column(f.name) for f in ERROR_SCHEMA}
    keys = record_keys(data, config) if n else pa.array([], pa.string())
    columns.update({
        RECORD_KEY: keys,
        PARTITION_PATH: partition_paths(data, config),
        OP: pa.array([UPSERT] * n, pa.int8()),
        FILE_ID: pa.nulls(n, pa.string()),
        TOPIC: topic,
        KAFKA_PARTITION: partition,
        OFFSET: offset,
        BUCKET: key_buckets(keys, config.num_buckets or 1),
    })
    return pa.table(columns, schema=write_schema())


@dataclass(frozen=True)
class ErrorStaging:
    """Where a batch's write tasks leave its error rows for the driver (picklable).

    The sink reads a micro-batch once: the tasks that write the data table's file groups
    also turn the batch's ``ERROR`` rows into error-table rows and stage them as Parquet in
    ``folder`` of ``storage`` (the data instant's scratch folder, which its commit or
    rollback deletes; on the data table's storage, so an object store works as a local
    folder does).
    The driver then writes the staged rows into the error table, and commits that before the
    data instant. ``config`` is the error table's.
    """

    storage: Storage
    folder: str
    """Relative to ``storage``."""
    batch_id: int
    target_table: str
    config: TableConfig

    def stage(self, prepared: pa.Table, token: tuple[int, int, int]) -> str | None:
        """Stage the error rows of ``prepared``; their file's path (relative to ``storage``),
        or None if there are none.

        Executor side. ``token`` (task partition, stage, attempt) names the file: a retried
        task writes a file of its own, and the driver reads only the files that the
        successful attempts report.
        """
        rows = error_rows(prepared, batch_id=self.batch_id, target_table=self.target_table,
                          config=self.config)
        if not rows.num_rows:
            return None
        name = "tidelake-errors-{}-{}-{}.parquet".format(*token)
        rel = f"{self.folder}/{name}"

        def produce(sink: pa.NativeFile) -> None:
            pq.write_table(rows, sink, compression="zstd")

        try:
            self.storage.write_new_with(rel, produce)
        except FileExistsError:  # left by an earlier run of this very attempt: replaced
            self.storage.delete(rel)
            self.storage.write_new_with(rel, produce)
        return rel


def read_staged(spark: SparkSession, storage: Storage, paths: Sequence[str]) -> DataFrame:
    """The staged error-table rows of :meth:`ErrorStaging.stage` (driver side): read by
    Spark from a local (or shared) folder, through ``storage`` on the driver from an object
    store (Spark's own file systems may not reach it; error rows are few)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(write_schema())
    if storage.is_local:
        return spark.read.schema(schema).parquet(*(storage.full(p) for p in paths))
    tables = [pq.read_table(pa.BufferReader(storage.read(p))) for p in paths]
    rows = pa.concat_tables(tables) if tables else write_schema().empty_table()
    return spark.createDataFrame(rows.cast(write_schema()), schema=schema)
