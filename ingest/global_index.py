"""The state-store-backed global index: record key → (partition, file group), in RocksDB.

A global index finds a key wherever it lives, so an update whose partition value changed
deletes the old copy and inserts the new one (Hudi's update-partition-path behaviour;
``update_partition_path=False`` instead updates the record in its old partition), and a
tombstone — which carries only the key — finds the partition to delete from.

``transformWithStateInPandas`` is a streaming operator, so it cannot run inside
``foreachBatch``; it sits in the streaming plan, before the sink::

    source → prepare (decoded rows packed by shard)
           → groupBy(shard).transformWithStateInPandas (rows packed by file group)
           → foreachBatch (unpacked in the write tasks)

:class:`~ingest.global_index_processor.GlobalIndexProcessor` is entered once per *shard* of the
keys (``xxhash64(key) mod shards``) and batch, executor side. It looks the shard's keys up in
this worker's image of the shard's state (:mod:`ingest.state_index`: base chunks + per-batch
deltas in the state store, an in-memory copy checked against them), applies each key's versions
to its stored entry (:func:`engine.merge.policy.resolve_key`: a tombstone deletes the live
version at its ordering value), emits the rows to write — each naming its partition and file
group — and writes the entries that changed as the batch's delta. Under event time a deleted key
keeps its ordering value in state, without a location, so that an older version arriving in a
later batch loses as it would in the same batch. Error rows bypass the state: their packs are
grouped by ``(True, "error-<first offset>")`` while records are grouped by ``(False, shard)``.

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
live key's partition, file group and ordering value, one task per file slice, packs them
by key shard as Arrow IPC streams (as the batches' rows are), and each shard's keys become
its base chunks. The cost is one scan of the table's key columns per
*new* query — proportional to the table, paid once, in parallel — after which tagging costs
an in-memory lookup per key and a few state calls per shard, however large the table. The
alternative, looking keys without state up in the table in every batch, costs a scan per
batch, since every new key is a key without state. A restarted query (same
checkpoint) ignores the initial state: its state already holds every key. Single writer: a
table written by anyone else while the query runs is not seen by the state.

**Layout.** New keys go to the file group of their bucket in their partition (the live group
for that bucket at query start, else the deterministic id:
:func:`engine.write.placement.bucket_group`, as the write client places keys), so retries and
replays agree; the table's bucket layout stays valid for the BUCKET index.

**Clustering.** On a table without the bucket layout a clustering (the job's own service
thread, or another process) rewrites file groups into new ones, and the state still names the
old group. Each task reads the table's replacecommits at its first key
(:class:`engine.index.relocation.Relocations`); a key whose stored group was replaced is
looked up in the groups that replaced it (its :class:`~engine.index.relocation.MovedKeys`
reads each clustering output's keys once per Python worker) and the state learns where it is
now. A new key whose bucket group was replaced goes to the group holding it if a replayed batch
wrote it before the clustering, else to the bucket's next group that was never replaced
(:func:`engine.write.placement.unreplaced_generation`). If a
clustering commits after a batch was tagged, the batch's commit is refused
(``WriteConflictError``) and the sink's retry runs the plan again, state included, on the new
layout.

**Cost.** pyspark's pandas state operator builds its input frames row by row (about 20 µs a
row with our columns) and converts its output cell by cell, so rows cross it packed: the read
tasks pack their rows by shard (:func:`ingest.rows.pack_by_shard`), the operator unpacks
a shard's blobs, tags them column-wise (a key through :func:`engine.merge.policy.resolve_single`
on the one version of the batch that decides it — its only one, the newest of its upserts, or
without event time its last; keys with deletes under event time key by key) and emits them
packed by file group (:data:`TAGGED_SCHEMA`); the write tasks unpack them. State calls are a
handful per shard and batch. ``bench/ingest.py``'s global run and ``bench/global_index.py``
measure it (``docs/benchmarks.md``). The number of shards is fixed for a checkpoint.

Requirements: ``spark.sql.streaming.stateStore.providerClass`` must be the RocksDB provider
(:func:`ensure_state_store`), and pyspark's state API needs ``protobuf`` (plus pandas and
pyarrow); ``grpcio`` is Spark Connect's (:func:`check_dependencies`).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from engine.errors import InvalidOptionError, TerminalError
from engine.merge.resolve import ordering_column, ordering_column_type
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.storage import Storage
from engine.write.distributed import STORED_ORDERING, TableView, slice_key_locations
from engine.write.distributed import live_bucket_groups as live_bucket_groups_of
from ingest.ddl import spark_schema
from ingest.rows import (
    FILE_ID,
    SHARD,
    pack_rows,
    packed_schema,
    shard_packed_schema,
)
from ingest.sink_config import DEFAULT_SHARDS, MAX_SHARDS
from ingest.state_index import (
    FOLD_MIN_ROWS,
    MAX_DELTAS,
    key_shards,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from engine.config import TableConfig
    from engine.table import Table

__all__ = [
    "DEFAULT_SHARDS",
    "MAX_SHARDS",
    "ROCKSDB_PROVIDER",
    "STATE_STORE_PROVIDER_KEY",
    "GlobalIndexSpec",
    "bootstrap_frame",
    "check_dependencies",
    "ensure_state_store",
]

STATE_STORE_PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
IS_ERROR = "_tl_is_error"
GROUP = "_tl_group"
META_STATE = "shard_meta"
BLOB_STATE = "shard_blobs"
META_SCHEMA = pa.schema([pa.field("base_token", pa.string()), pa.field("base_chunks", pa.int32()),
                         pa.field("base_rows", pa.int64()), pa.field("next_delta", pa.int64()),
                         pa.field("deltas", pa.string())])
BLOB_KEY_SCHEMA = pa.schema([pa.field("slot", pa.int64())])
BLOB_VALUE_SCHEMA = pa.schema([pa.field("data", pa.binary())])


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
    RocksDB's changelog checkpointing is turned on unless the session says otherwise: a
    batch then uploads the changes it made (~28 bytes a changed key) instead of the SST
    files RocksDB's compactions rewrote (41 MiB a batch at 10M keys, ``docs/benchmarks.md``).
    """
    if spark.conf.get(CHANGELOG_KEY, None) in (None, ""):
        spark.conf.set(CHANGELOG_KEY, "true")
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
    event_time: bool
    """Versions ordered by the ordering field: the table's
    :attr:`~engine.config.TableConfig.orders_by_event_time`."""
    ordering_type: pa.DataType | None
    update_partition_path: bool = True
    shards: int = DEFAULT_SHARDS
    """Key shards (fixed for a checkpoint): the operator is entered once per shard and batch."""
    index_id: str = ""
    """Names this index (table and writer) for the workers' shard images."""
    fold_min_rows: int = FOLD_MIN_ROWS
    max_deltas: int = MAX_DELTAS
    """When a shard's deltas are folded into a new base (:meth:`Meta.due_for_fold`)."""
    table_storage: Storage | None = None
    table_config: TableConfig | None = None
    """The table, read by tasks to follow keys that a clustering moved (tables without
    the bucket layout; None: the table is never clustered)."""

    @property
    def state_ordering_type(self) -> pa.DataType:
        """Type of the ordering value kept in state (timestamps and dates as integers)."""
        t = self.ordering_type
        return pa.int64() if t is None else ordering_column_type(t)



TAGGED_SCHEMA = packed_schema([pa.field(PARTITION_PATH, pa.string()),
                               pa.field(FILE_ID, pa.string())])
"""What the state operator emits: tagged rows packed by file group (null: rows without one —
errors, versions that lost — spread by their first offset)."""


def check_state_layout(checkpoint: str) -> None:
    """Refuse a checkpoint whose state the per-key operator of earlier tidelake versions wrote.

    Its state (one ``location`` value per record key) means nothing to the shard layout;
    Spark would start the shards empty and every stored key would look new. Checked on local
    checkpoints (the state schema files Spark keeps under ``state/<operator>/_stateSchema``).
    """
    root = checkpoint[len("file://"):] if checkpoint.startswith("file://") else checkpoint
    if "://" in root or not os.path.isdir(os.path.join(root, "state")):
        return
    schemas = ours = 0
    for folder, _, files in os.walk(os.path.join(root, "state")):
        if os.path.basename(os.path.dirname(folder)) != "_stateSchema":
            continue
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                schemas += 1
                ours += META_STATE.encode() in f.read()
    if schemas and not ours:
        raise TerminalError(
            f"checkpoint {checkpoint}: its GLOBAL_STATE index state was written by an earlier "
            "tidelake (one state value per key), which this version cannot read; start the job "
            "on a new checkpoint location: the new query bootstraps its state from the table "
            "and resumes from the offsets the table records")


# --- bootstrapping from the table ---------------------------------------------------------


def _state_rows(locations: pa.Table, spec_ordering: pa.DataType) -> pa.Table:
    n = locations.num_rows
    if STORED_ORDERING in locations.column_names:
        ordering = locations.column(STORED_ORDERING).combine_chunks()
        # The same values the prepared rows carry (timestamps as UTC micros, dates as days).
        ordering = ordering_column(ordering, ordering.type).cast(spec_ordering)
    else:
        ordering = pa.nulls(n, spec_ordering)
    return pa.table({RECORD_KEY: locations.column("key").combine_chunks(),
                     "partition_path": locations.column("loc_partition").combine_chunks(),
                     "file_id": locations.column("loc_file_id").combine_chunks(),
                     "ordering": ordering})


BOOTSTRAP_PACK_AT = 500_000
"""A bootstrap task packs the locations it read by shard once it holds this many."""


def _packed_by_shard(parts: list[pa.Table], shards: int) -> Iterator[pa.RecordBatch]:
    rows = pa.concat_tables(parts)
    yield from pack_rows(rows, keys={SHARD: key_shards(rows.column(0), shards)}).to_batches()


def _read_locations(view: TableView, ordering_type: pa.DataType, shards: int
                    ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        held: list[pa.Table] = []
        held_rows = 0
        for batch in batches:
            indexes = [int(i) for i in batch.column(0).to_pylist()]
            for found in slice_key_locations(view, indexes):
                if found.num_rows:
                    held.append(_state_rows(found, ordering_type))
                    held_rows += found.num_rows
                if held_rows >= BOOTSTRAP_PACK_AT:
                    yield from _packed_by_shard(held, shards)
                    held, held_rows = [], 0
        if held:
            yield from _packed_by_shard(held, shards)
    return run


def bootstrap_frame(spark: SparkSession, table: Table, spec: GlobalIndexSpec) -> DataFrame:
    """Every live key of ``table`` with its location and ordering value, read by tasks and
    packed by key shard (:func:`ingest.rows.pack_rows`: a few Arrow IPC streams of
    (key, partition path, file id, ordering value) per shard and task), so that pyspark
    hands the state operator a handful of values per shard instead of every key.

    Driver side: lists the latest file slices; executors read one slice's key (and ordering)
    columns each. Lazy: Spark evaluates it in the first batch of a new query only.
    """
    view = TableView.load(table.storage, table.config).materialize()
    slices = view.latest_file_slices()
    if not slices:
        return spark.createDataFrame([], spark_schema(shard_packed_schema()))
    parallelism = max(1, min(len(slices), spark.sparkContext.defaultParallelism * 2))
    return spark.range(len(slices), numPartitions=parallelism).mapInArrow(
        _read_locations(view, spec.state_ordering_type, spec.shards),
        spark_schema(shard_packed_schema()))


def live_bucket_groups(table: Table) -> dict[tuple[str, int], str]:
    """(partition, bucket) → file id of the table's live bucket groups (driver side;
    :func:`engine.write.distributed.live_bucket_groups`)."""
    return live_bucket_groups_of(TableView.load(table.storage, table.config),
                                 table.write_config)

