"""The state-store-backed global index: record key → (partition, file group), in RocksDB.

A global index finds a key wherever it lives, so an update whose partition value changed
deletes the old copy and inserts the new one (Hudi's update-partition-path behaviour;
``update_partition_path=False`` instead updates the record in its old partition), and a
tombstone — which carries only the key — finds the partition to delete from.

``transformWithStateInPandas`` is a streaming operator, so it cannot run inside
``foreachBatch``; it sits in the streaming plan, before the sink::

    source → prepare (keys; slim rows) → groupBy(key).transformWithStateInPandas → foreachBatch

:class:`GlobalIndexProcessor` sees all versions of a key in the batch (executor side, one call
per key), applies them to the stored state (:func:`ingest.resolve.resolve_key`: a tombstone
deletes the live version at its ordering value), emits the rows to write — each naming its
partition and file group — and updates the state. Under event time a deleted key keeps its
ordering value in state, without a location, so that an older version arriving in a later
batch loses as it would in the same batch. Error rows bypass the state: they are
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
:func:`engine.write.write_client.new_bucket_file_id`), so retries and replays agree; the table's
bucket layout stays valid for the BUCKET index.

**Clustering.** On a table without the bucket layout a clustering (the job's own service
thread, or another process) rewrites file groups into new ones, and the state still names the
old group. Each task reads the table's replacecommits at its first key
(:class:`engine.index.relocation.FileGroupLineage`); a key whose stored group was replaced is
looked up in the groups that replaced it (:class:`~engine.index.relocation.MovedKeys`, which
reads each clustering output's keys once per Python worker) and the state learns where it is
now. A new key whose bucket group was replaced goes to the group holding it if a replayed batch
wrote it before the clustering, else to the bucket's next group that was never replaced. If a
clustering commits after a batch was tagged, the batch's commit is refused
(``WriteConflictError``) and the sink's retry runs the plan again, state included, on the new
layout.

**Cost.** The operator calls Python once per key and batch. With
``transformWithStateInPandas`` pyspark builds a pandas frame for every key's input and output
(and, with pandas 3, warns on each). Measured on a loaded 2-core machine, a micro-batch of
5,000 new single-row keys took 36-76 s through the sink with ``transformWithStateInPandas`` and
11-17 s with the row-based ``transformWithState`` (pyspark 4.1+) — the same operator, state
store and guarantees. The sink defaults to the pandas API and offers the row API as
``state_api="rows"``; the choice is fixed for a checkpoint.

Requirements: ``spark.sql.streaming.stateStore.providerClass`` must be the RocksDB provider
(:func:`ensure_state_store`), and pyspark's state API needs ``protobuf`` (plus pandas and
pyarrow); ``grpcio`` is Spark Connect's (:func:`check_dependencies`).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import importlib.util
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues

from engine.errors import InvalidOptionError, TerminalError
from engine.index.bucket import bucket_id
from engine.index.relocation import FileGroupLineage, MovedKeys
from engine.index.simple import ORDERING as LOC_ORDERING
from engine.index.simple import key_locations
from engine.layout.file_group import (
    FileSlice,
    build_file_slices,
    list_table_files,
    visible_instants,
)
from engine.read.reader import SliceReader
from engine.schema import PARTITION_PATH, RECORD_KEY, arrow_from_avro_json
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.write.write_client import new_bucket_file_id
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
    ordering_column,
    spark_schema,
)
from ingest.resolve import DELETED, LIVE, KeyState, resolve_key

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
    row_api: bool = False
    """Use ``transformWithState`` (rows) instead of ``transformWithStateInPandas``."""
    table_path: str | None = None
    table_config: TableConfig | None = None
    """The table, read by tasks to follow keys that a clustering moved (tables without
    the bucket layout; None: the table is never clustered)."""

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

    def file_group(self, key: str, partition: str, generation: int = 0) -> str:
        """The file group a new key goes to in ``partition``: its bucket's (``generation``
        > 0: the bucket's next group, once clusterings replaced the earlier ones)."""
        bucket = bucket_id(key, self.num_buckets)
        if generation:
            return new_bucket_file_id(self.table_name, partition, bucket, generation)
        return (self.bucket_groups.get((partition, bucket))
                or new_bucket_file_id(self.table_name, partition, bucket))


_EPOCH_DATE = _dt.date(1970, 1, 1)
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def comparable(value: Any) -> Any:
    """An ordering value in the form kept in state and compared: plain Python.

    Prepared rows carry timestamps and dates as integers already (UTC microseconds, days:
    :func:`ingest.prepare.ordering_column`), as the bootstrap stores them; pyspark's pandas
    conversion would otherwise hand over naive timestamps in the *session* time zone, which
    compared with the bootstrapped UTC values judged updates of bootstrapped keys older.
    Temporal objects are still accepted: aware datetimes by their UTC instant."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if hasattr(value, "value") and type(value).__name__ == "Timestamp":  # pandas Timestamp
        return int(value.value) // 1000
    if isinstance(value, _dt.datetime):  # naive: local time, as pyspark's rows give it
        return (value.astimezone(_dt.timezone.utc) - _EPOCH) // _dt.timedelta(microseconds=1)
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
    adds a ``DELETE`` of its old copy at the stored ordering value. Error rows pass through
    unchanged. Deterministic for a given input and state, so replays tag identically.
    """

    def __init__(self, spec: GlobalIndexSpec) -> None:
        self.spec = spec

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the value state (executor, and once on the driver for the schema)."""
        # pyspark warns that pandas >= 3 is not fully supported on every frame it converts,
        # i.e. once per key here: a stderr line and a stack walk per key. Silence just that.
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                                category=FutureWarning)
        self._location = handle.getValueState(STATE_NAME, self.spec.state_schema())
        self._moves: _Moves | None = None  # the table's clusterings, read once per task

    def handleInitialState(self, key: Any, initialState: Any,
                           timerValues: TimerValues) -> None:
        """Seed a key's location from the table scan (first batch of a new query only).

        Columns by position, as :func:`bootstrap_frame` makes them: key, partition path,
        file id, ordering value (then the grouping columns).
        """
        if self.spec.row_api:  # one Row per call
            row = list(initialState)
        else:
            if len(initialState) > 1:
                log.warning("record key %r is stored %d times in the table; the global index "
                            "tracks one copy", key[1], len(initialState))
            row = [initialState.iat[len(initialState) - 1, i] for i in range(4)]
        ordering = row[3]
        self._location.update((str(row[1]), str(row[2]),
                               None if _is_missing(ordering) else comparable(ordering)))

    def handleInputRows(self, key: Any, rows: Iterator[Any],
                        timerValues: TimerValues) -> Iterator[Any]:
        """Tag one key's versions of this batch and update its location.

        Called once per key, so it stays in plain Python: one conversion of the input to
        row lists, one output frame (per-key pandas operations would dominate the cost).
        """
        width = len(self.spec.slim_schema)
        records: list[list[Any]] = []
        # Columns arrive in the input's order (pyspark may name them _0, _1, ...): the slim
        # schema, then the two grouping columns, dropped here.
        if self.spec.row_api:
            records = [list(row)[:width] for row in rows]
        else:
            for frame in rows:
                if len(frame):
                    records.extend(r[:width] for r in frame.to_numpy(dtype=object).tolist())
        if not records:
            return
        if not bool(key[0]):  # error rows pass through, without state
            records = self._tag(str(key[1]), records)
        if self.spec.row_api:
            make = self._row_type
            yield from (make(*r) for r in records)
        else:
            yield self._frame(records)

    def _tag(self, key: str, records: list[list[Any]]) -> list[list[Any]]:
        spec, col = self.spec, self._columns
        if len(records) > 1:
            records.sort(key=lambda r: (r[col[TOPIC]], r[col[KAFKA_PARTITION]], r[col[OFFSET]]))
        ops = [int(r[col[OP]]) for r in records]
        if spec.event_time:
            orderings = [comparable(r[col[ORDERING]]) for r in records]
            nulls = [bool(r[col[ORDERING_NULL]]) for r in records]
        else:
            orderings, nulls = [None] * len(ops), [True] * len(ops)
        stored = self._location.get()
        if stored is not None and stored[0] is not None:  # where the key lives now
            stored = (stored[0], self._current_group(key, stored[0], stored[1]), stored[2])
        if stored is None:
            before = KeyState()
        else:  # a deleted key keeps its ordering value, with no location
            kind = LIVE if stored[0] is not None else DELETED
            before = KeyState(kind, stored[2] if spec.event_time else None)
        outcome = resolve_key(ops, orderings, nulls, event_time=spec.event_time, stored=before)
        raw_values = [r[col[VALUE]] for r in records]
        for r in records:  # every version but the winner writes nothing
            r[col[OP]], r[col[VALUE]] = SKIP, None
        after = outcome.state
        if after.kind != LIVE:
            # Event time: a deleted key keeps the ordering value it was deleted at, so that an
            # older version arriving later loses, as it does in the table's readers.
            if after.kind == DELETED and spec.event_time:
                self._location.update((None, None, after.ordering))
            else:
                self._location.clear()
        if outcome.winner < 0:  # nothing to write (a live key is unchanged)
            return records
        winner = records[outcome.winner]
        if spec.event_time:  # a tombstone deletes at the deleted version's ordering value
            winner[col[ORDERING]], winner[col[ORDERING_NULL]] = outcome.ordering, False
        if after.kind == DELETED:  # the stored live copy is deleted where it is
            assert stored is not None and stored[0] is not None
            winner[col[OP]] = DELETE
            winner[col[PARTITION_PATH]], winner[col[FILE_ID]] = stored[0], stored[1]
            return records
        target = winner[col[PARTITION_PATH]]
        if stored is None or stored[0] is None:
            fid = self._new_key_group(key, target)
        elif target == stored[0] or not spec.update_partition_path:
            target, fid = stored[0], stored[1]
        else:  # moved: delete the old copy at its ordering value, insert the new one
            old = list(winner)
            old[col[OP]], old[col[PARTITION_PATH]], old[col[FILE_ID]] = DELETE, stored[0], stored[1]
            if spec.event_time:
                old[col[ORDERING]], old[col[ORDERING_NULL]] = stored[2], stored[2] is None
            records.append(old)
            fid = self._new_key_group(key, target)
        winner[col[OP]], winner[col[PARTITION_PATH]], winner[col[FILE_ID]] = UPSERT, target, fid
        winner[col[VALUE]] = raw_values[outcome.winner]  # decoded again after tagging
        self._location.update((target, fid, after.ordering))
        return records

    def _relocations(self) -> _Moves | None:
        spec = self.spec
        if spec.table_path is None or spec.table_config is None:
            return None
        if self._moves is None:
            self._moves = _Moves.load(spec.table_path, spec.table_config)
        return self._moves

    def _current_group(self, key: str, partition: str, file_id: str) -> str:
        """The group a key stored in ``(partition, file_id)`` is in now: that one, unless a
        clustering replaced it; then the live group it moved to (the state learns it)."""
        moves = self._relocations()
        if moves is None or not moves.lineage.is_replaced(partition, file_id):
            return file_id
        found = moves.locate(partition, file_id, key)
        if found is None:  # not in the table any more (another writer deleted it)
            log.warning("record key %r: its file group %s/%s was replaced and no group that "
                        "replaced it has the key; writing it as a new key", key, partition,
                        file_id)
            return self._new_key_group(key, partition)
        return found

    def _new_key_group(self, key: str, partition: str) -> str:
        """The group a key without a location goes to: its bucket's group, or — that one
        replaced by a clustering — the group holding the key if a replayed batch wrote it
        there before the clustering, else the bucket's next group never replaced."""
        group = self.spec.file_group(key, partition)
        moves = self._relocations()
        if moves is None or not moves.lineage.is_replaced(partition, group):
            return group
        found = moves.locate(partition, group, key)
        if found is not None:
            return found
        generation = 1
        while moves.lineage.is_replaced(partition, group := self.spec.file_group(
                key, partition, generation)):
            generation += 1
        return group

    @functools.cached_property
    def _columns(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.spec.slim_schema.names)}

    @functools.cached_property
    def _row_type(self) -> Any:
        from pyspark.sql import Row

        return Row(*self.spec.slim_schema.names)

    def _frame(self, records: list[list[Any]]) -> Any:
        """The output frame: plain Python objects, None for missing (pyspark converts them to
        the declared types; pandas' own string and NaN handling would get in the way)."""
        for r in records:
            for i, v in enumerate(r):
                if _is_missing(v):
                    r[i] = None
        return _pandas().DataFrame(records, columns=self.spec.slim_schema.names, dtype=object)

    def close(self) -> None:
        """Nothing to release."""


_MOVED_KEYS: dict[str, MovedKeys] = {}
"""Per table path: the keys of clustering outputs, read once per Python worker."""


@dataclass
class _Moves:
    """The table's replaced file groups as one task sees them (loaded at its first key)."""

    timeline: Timeline
    lineage: FileGroupLineage
    moved: MovedKeys

    @classmethod
    def load(cls, path: str, config: TableConfig) -> _Moves:
        storage = Storage(path)
        timeline = Timeline.load(storage, config)
        moved = _MOVED_KEYS.setdefault(path, MovedKeys(storage))
        return cls(timeline, FileGroupLineage.of(timeline), moved)

    def locate(self, partition: str, file_id: str, key: str) -> str | None:
        return self.moved.locate(self.timeline, self.lineage, partition, file_id, [key])[0]


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
    grouped = keyed.groupBy(IS_ERROR, GROUP)
    operator = grouped.transformWithState if spec.row_api else \
        grouped.transformWithStateInPandas
    return operator(GlobalIndexProcessor(spec), spark_schema(spec.slim_schema), "Append", "None",
                    initialState=seeded.groupBy(IS_ERROR, GROUP))


# --- bootstrapping from the table ---------------------------------------------------------


def _state_rows(locations: pa.Table, spec_ordering: pa.DataType) -> pa.Table:
    n = locations.num_rows
    if LOC_ORDERING in locations.column_names:
        ordering = locations.column(LOC_ORDERING).combine_chunks()
        # The same values the prepared rows carry (timestamps as UTC micros, dates as days).
        ordering = ordering_column(ordering, ordering.type).cast(spec_ordering)
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

