"""The state-store-backed global index: record key → (partition, file group), in RocksDB.

A global index finds a key wherever it lives, so an update whose partition value changed
deletes the old copy and inserts the new one (Hudi's update-partition-path behaviour;
``update_partition_path=False`` instead updates the record in its old partition), and a
tombstone — which carries only the key — finds the partition to delete from.

``transformWithStateInPandas`` is a streaming operator, so it cannot run inside
``foreachBatch``; it sits in the streaming plan, before the sink::

    source → prepare (keys; slim rows) → groupBy(key).transformWithStateInPandas → foreachBatch

:class:`GlobalIndexProcessor` sees all versions of a key in the batch (executor side, one call
per key), picks the winner (:func:`ingest.resolve.winner_index`), compares it with the stored
location and ordering value, emits the rows to write — each naming its partition and file
group — and updates the state (cleared on delete). Error rows bypass the state: they are
grouped by ``(True, topic-partition)`` while records are grouped by ``(False, key)``.

**Exactly once.** Spark commits a state store version with the micro-batch: batch *N* always
starts from the version committed by batch *N-1*, and the query only moves past *N* once the
sink returned and every state store partition committed (Spark 4 checks this; a batch whose
plan never ran fails with ``STATE_STORE_COMMIT_VALIDATION_FAILED``). If the sink's Hudi commit
fails, the batch is replayed from the pre-batch state and re-tags identically. If the Hudi
commit succeeded but the query died before Spark recorded the batch, the replayed batch is
skipped by the sink — which still runs the plan (a ``noop`` write) so that the state version
of that batch is committed, equal to the one the first attempt computed.

**Bootstrapping.** When the query starts without a checkpoint, the state is seeded from the
table (``initialState``, applied by Spark in the first batch only): a Spark job reads every
live key's partition, file group and ordering value, one task per file slice. The cost is one
scan of the table's key columns per *new* query — proportional to the table, paid once, in
parallel — after which tagging costs one state lookup per key in a batch, however large the
table. The alternative, looking keys without state up in the table in every batch, costs a
scan per batch, since every new key is a key without state. A restarted query (same
checkpoint) ignores the initial state: its state already holds every key. Single writer: a
table written by anyone else while the query runs is not seen by the state.

**Layout.** New keys go to the file group of their bucket in their partition (the live group
for that bucket at query start, else the deterministic id
:func:`engine.write_client.new_bucket_file_id`), so retries and replays agree; the table's
bucket layout stays valid for the BUCKET index.

Requirements: ``spark.sql.streaming.stateStore.providerClass`` must be the RocksDB provider
(:func:`ensure_state_store`), and pyspark's state API needs ``protobuf`` (plus pandas and
pyarrow); ``grpcio`` is Spark Connect's (:func:`check_dependencies`).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import importlib.util
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues

from engine.errors import InvalidOptionError, TerminalError
from engine.file_group import FileSlice, build_file_slices, list_table_files, visible_instants
from engine.index.bucket import bucket_id
from engine.index.simple import ORDERING as LOC_ORDERING
from engine.index.simple import key_locations
from engine.reader import SliceReader
from engine.schema import PARTITION_PATH, RECORD_KEY, arrow_from_avro_json
from engine.storage import Storage
from engine.timeline import Timeline
from engine.write_client import new_bucket_file_id
from ingest.prepare import (
    DELETE,
    ERROR,
    FILE_ID,
    KAFKA_PARTITION,
    OFFSET,
    OP,
    ORDERING,
    ORDERING_NULL,
    SKIP,
    TOPIC,
    UPSERT,
    VALUE,
    spark_schema,
)
from ingest.resolve import winner_index

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from engine.config import TableConfig
    from engine.table import Table

__all__ = [
    "ROCKSDB_PROVIDER",
    "STATE_STORE_PROVIDER_KEY",
    "GlobalIndexProcessor",
    "GlobalIndexSpec",
    "bootstrap_frame",
    "check_dependencies",
    "ensure_state_store",
    "tag_frame",
]

log = logging.getLogger(__name__)

STATE_STORE_PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
IS_ERROR = "_tl_is_error"
GROUP = "_tl_group"
STATE_NAME = "location"


def check_dependencies() -> None:
    """Raise :class:`TerminalError` naming a missing package the state operator needs."""
    for module, package in (("google.protobuf", "protobuf"), ("grpc", "grpcio"),
                            ("pandas", "pandas")):
        if importlib.util.find_spec(module) is None:
            raise TerminalError(f"the GLOBAL_STATE index needs the '{package}' package "
                                "(pyspark's transformWithStateInPandas); install it")


def ensure_state_store(spark: SparkSession) -> None:
    """Make the session use the RocksDB state store (required by ``transformWithState``).

    An unset provider is set to RocksDB for this session (it is recorded in the query's
    checkpoint on its first batch); any other explicit provider is an error naming the key.
    """
    current = spark.conf.get(STATE_STORE_PROVIDER_KEY, None)
    default = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    if current in (None, "", default):
        spark.conf.set(STATE_STORE_PROVIDER_KEY, ROCKSDB_PROVIDER)
    elif current != ROCKSDB_PROVIDER:
        raise InvalidOptionError(STATE_STORE_PROVIDER_KEY,
                                 f"the GLOBAL_STATE index needs {ROCKSDB_PROVIDER}, "
                                 f"the session has {current}")


@dataclass(frozen=True)
class GlobalIndexSpec:
    """What the processor needs (picklable; fixed when the streaming query is defined)."""

    table_name: str
    num_buckets: int
    bucket_groups: Mapping[tuple[str, int], str]
    """Live bucket file groups at query start: (partition, bucket) → file id."""
    slim_schema: pa.Schema
    """Schema of the rows in and out (prepared slim rows)."""
    event_time: bool
    ordering_type: pa.DataType | None
    update_partition_path: bool = True

    @property
    def state_ordering_type(self) -> pa.DataType:
        """Type of the ordering value kept in state (timestamps and dates as integers)."""
        t = self.ordering_type
        if t is None or pa.types.is_timestamp(t) or pa.types.is_date(t):
            return pa.int64()
        return t

    def state_schema(self) -> StructType:
        """Spark schema of the state value: where the key lives and its ordering value."""
        return spark_schema(pa.schema([
            pa.field("partition_path", pa.string()), pa.field("file_id", pa.string()),
            pa.field("ordering", self.state_ordering_type)]))

    def file_group(self, key: str, partition: str) -> str:
        """The file group a new key goes to in ``partition``: its bucket's."""
        bucket = bucket_id(key, self.num_buckets)
        return (self.bucket_groups.get((partition, bucket))
                or new_bucket_file_id(self.table_name, partition, bucket))


_EPOCH_DATE = _dt.date(1970, 1, 1)
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def comparable(value: Any) -> Any:
    """An ordering value in the form kept in state and compared: plain Python, timestamps
    as microseconds since the epoch, dates as days."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if hasattr(value, "value") and type(value).__name__ == "Timestamp":  # pandas Timestamp
        return int(value.value) // 1000
    if isinstance(value, _dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc)
        return (aware - _EPOCH) // _dt.timedelta(microseconds=1)
    if isinstance(value, _dt.date):
        return (value - _EPOCH_DATE).days
    if isinstance(value, decimal.Decimal | str | bool | int | float):
        return value
    raise TypeError(f"unsupported ordering value {value!r}")


class GlobalIndexProcessor(StatefulProcessor):
    """Tags each key's versions with their file group and keeps the key's location in state.

    Executor side (one instance per task, built from a pickled :class:`GlobalIndexSpec`).
    Output rows (the slim schema): for each input row either the row to write — op
    ``UPSERT``/``DELETE`` with ``_hoodie_partition_path`` and the file group set — or op
    ``SKIP`` (a version that lost; kept for its Kafka offset); a key that moved partitions
    adds a natural-order ``DELETE`` of its old copy. Error rows pass through unchanged.
    Deterministic for a given input and state, so replays tag identically.
    """

    def __init__(self, spec: GlobalIndexSpec) -> None:
        self.spec = spec

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the value state (executor, and once on the driver for the schema)."""
        self._location = handle.getValueState(STATE_NAME, self.spec.state_schema())

    def handleInitialState(self, key: Any, initialState: Any,
                           timerValues: TimerValues) -> None:
        """Seed a key's location from the table scan (first batch of a new query only)."""
        rows = initialState
        if len(rows) > 1:
            log.warning("record key %r is stored %d times in the table; the global index "
                        "tracks the copy in %s", key[1], len(rows), rows.iloc[-1]["partition_path"])
        row = rows.iloc[-1]
        ordering = row["ordering"]
        self._location.update((str(row["partition_path"]), str(row["file_id"]),
                               None if _is_missing(ordering) else comparable(ordering)))

    def handleInputRows(self, key: Any, rows: Iterator[Any],
                        timerValues: TimerValues) -> Iterator[Any]:
        """Tag one key's versions of this batch and update its location."""
        pd = _pandas()
        frames = [f for f in rows if len(f)]
        if not frames:
            return
        pdf = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        # Columns arrive in the input's order (pyspark may name them _0, _1, ...): the slim
        # schema, then the two grouping columns, which are dropped.
        names = list(self.spec.slim_schema.names)
        pdf = pdf.iloc[:, :len(names)].set_axis(names, axis=1)
        if bool(key[0]):  # error rows: no state, pass through
            yield _plain(pdf, self.spec.slim_schema)
            return
        pdf = pdf.sort_values([TOPIC, KAFKA_PARTITION, OFFSET], kind="stable") \
            .reset_index(drop=True)
        yield _plain(self._tag(str(key[1]), pdf), self.spec.slim_schema)

    def _tag(self, key: str, pdf: Any) -> Any:
        pd = _pandas()
        spec = self.spec
        ops = [int(v) for v in pdf[OP]]
        if spec.event_time:
            orderings = [comparable(v) for v in pdf[ORDERING]]
            nulls = [bool(v) for v in pdf[ORDERING_NULL]]
        else:
            orderings, nulls = [None] * len(ops), [True] * len(ops)
        w = winner_index(ops, orderings, nulls, event_time=spec.event_time)
        stored = self._location.get()
        out_ops = [SKIP] * len(ops)
        parts: list[Any] = list(pdf[PARTITION_PATH])
        fids: list[Any] = [None] * len(ops)
        extra = None
        win_ordering = None if nulls[w] else orderings[w]
        loses = (stored is not None and spec.event_time and win_ordering is not None
                 and stored[2] is not None and win_ordering < stored[2])
        if ops[w] == DELETE:
            if stored is not None and not loses:
                out_ops[w], parts[w], fids[w] = DELETE, stored[0], stored[1]
                self._location.clear()
        elif not loses:
            target = parts[w]
            if stored is None:
                fid = spec.file_group(key, target)
            elif target == stored[0] or not spec.update_partition_path:
                target, fid = stored[0], stored[1]
            else:  # moved: delete the old copy (natural order), insert into the new partition
                extra = pdf.iloc[[w]].copy()
                extra[OP], extra[PARTITION_PATH], extra[FILE_ID] = DELETE, stored[0], stored[1]
                extra[VALUE] = None
                if spec.event_time:
                    extra[ORDERING_NULL] = True
                fid = spec.file_group(key, target)
            out_ops[w], parts[w], fids[w] = UPSERT, target, fid
            self._location.update((target, fid, win_ordering))
        pdf[OP] = pd.Series(out_ops, dtype="int8")
        pdf[PARTITION_PATH] = parts
        pdf[FILE_ID] = fids
        # Only a row to write needs its raw value (to decode its data after tagging).
        pdf[VALUE] = [v if op == UPSERT else None for v, op in zip(pdf[VALUE], out_ops,
                                                                     strict=True)]
        return pdf if extra is None else pd.concat([pdf, extra], ignore_index=True)

    def close(self) -> None:
        """Nothing to release."""


def _plain(pdf: Any, schema: pa.Schema) -> Any:
    """``pdf`` with its string and binary columns as plain objects, None for missing.

    pyspark hands such columns over Arrow-backed (pandas 3), or as float NaN when a column
    is all null; after sorting or concatenating either may not convert back to Arrow.
    """
    for f in schema:
        if pa.types.is_string(f.type) or pa.types.is_binary(f.type):
            column = pdf[f.name]
            pdf[f.name] = column.astype(object).where(column.notna(), None)
    return pdf


def _pandas() -> Any:
    """pandas, imported where the state operator runs (executors); untyped for mypy."""
    import pandas

    return pandas


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN / NaT
    except (TypeError, ValueError):
        return False


def tag_frame(prepared: DataFrame, spec: GlobalIndexSpec, initial: DataFrame) -> DataFrame:
    """The streaming plan's tagging step: ``groupBy(key).transformWithStateInPandas``.

    The grouping key is (is error, record key) — error rows use ``topic-partition`` instead of
    a key, and never touch the state.
    """
    from pyspark.sql import functions as F

    keyed = prepared.withColumn(IS_ERROR, F.col(OP) == ERROR).withColumn(
        GROUP, F.when(F.col(OP) == ERROR, F.concat_ws("-", F.col(TOPIC),
                                                      F.col(KAFKA_PARTITION).cast("string")))
        .otherwise(F.col(RECORD_KEY)))
    seeded = initial.withColumn(IS_ERROR, F.lit(False)).withColumn(GROUP, F.col(RECORD_KEY))
    return keyed.groupBy(IS_ERROR, GROUP).transformWithStateInPandas(
        GlobalIndexProcessor(spec), spark_schema(spec.slim_schema), "Append", "None",
        initialState=seeded.groupBy(IS_ERROR, GROUP))


# --- bootstrapping from the table ---------------------------------------------------------


def _state_rows(locations: pa.Table, spec_ordering: pa.DataType) -> pa.Table:
    n = locations.num_rows
    if LOC_ORDERING in locations.column_names:
        ordering = locations.column(LOC_ORDERING).combine_chunks()
        if pa.types.is_timestamp(ordering.type):
            ordering = ordering.cast(pa.timestamp("us")).cast(pa.int64())
        elif pa.types.is_date(ordering.type):
            ordering = ordering.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
        ordering = ordering.cast(spec_ordering)
    else:
        ordering = pa.nulls(n, spec_ordering)
    return pa.table({RECORD_KEY: locations.column("key").combine_chunks(),
                     "partition_path": locations.column("loc_partition").combine_chunks(),
                     "file_id": locations.column("loc_file_id").combine_chunks(),
                     "ordering": ordering})


def _read_locations(base_path: str, config: TableConfig, slices: list[FileSlice],
                    ordering_type: pa.DataType
                    ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        storage = Storage(base_path)
        timeline = Timeline.load(storage, config)
        schema_json = timeline.latest_schema()
        reader = SliceReader(storage, timeline, visible_instants(timeline),
                             arrow_from_avro_json(schema_json) if schema_json else None)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                found = key_locations(reader, [slices[int(i)]], None)
                if found.num_rows:
                    yield from _state_rows(found, ordering_type).to_batches()
    return run


def bootstrap_frame(spark: SparkSession, table: Table, spec: GlobalIndexSpec) -> DataFrame:
    """Every live key of ``table`` with its location and ordering value, read by tasks.

    Driver side: lists the latest file slices; executors read one slice's key (and ordering)
    columns each. Lazy: Spark evaluates it in the first batch of a new query only.
    """
    timeline = Timeline.load(table.storage, table.config)
    slices = build_file_slices(list_table_files(table.storage), timeline,
                               visible_instants(timeline))
    schema = pa.schema([pa.field(RECORD_KEY, pa.string()),
                        pa.field("partition_path", pa.string()),
                        pa.field("file_id", pa.string()),
                        pa.field("ordering", spec.state_ordering_type)])
    if not slices:
        return spark.createDataFrame([], spark_schema(schema))
    parallelism = max(1, min(len(slices), spark.sparkContext.defaultParallelism * 2))
    return spark.range(len(slices), numPartitions=parallelism).mapInArrow(
        _read_locations(table.storage.base_path, table.config, slices,
                        spec.state_ordering_type),
        spark_schema(schema))


def live_bucket_groups(table: Table) -> dict[tuple[str, int], str]:
    """(partition, bucket) → file id of the table's live bucket groups (driver side)."""
    from ingest.spark_write import TableLayout

    if table.config.num_buckets is None:
        return {}
    timeline = Timeline.load(table.storage, table.config)
    slices = build_file_slices(list_table_files(table.storage), timeline,
                               visible_instants(timeline))
    return dict(TableLayout.of(slices, bucketed=True).buckets)

