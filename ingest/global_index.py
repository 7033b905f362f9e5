"""The state-store-backed global index: record key → (partition, file group), in RocksDB.

A global index finds a key wherever it lives, so an update whose partition value changed
deletes the old copy and inserts the new one (Hudi's update-partition-path behaviour;
``update_partition_path=False`` instead updates the record in its old partition), and a
tombstone — which carries only the key — finds the partition to delete from.

``transformWithStateInPandas`` is a streaming operator, so it cannot run inside
``foreachBatch``; it sits in the streaming plan, before the sink::

    source → prepare (keys; slim rows packed by shard)
           → groupBy(shard).transformWithStateInPandas (rows packed by file group)
           → foreachBatch (unpacked in the write tasks)

:class:`GlobalIndexProcessor` is entered once per *shard* of the keys (``xxhash64(key) mod
shards``) and batch, executor side. It looks the shard's keys up in this worker's image of the
shard's state (:mod:`ingest.state_index`: base chunks + per-batch deltas in the state store,
an in-memory copy checked against them), applies each key's versions to its stored entry
(:func:`engine.merge.policy.resolve_key`: a tombstone deletes the live version at its ordering
value), emits the rows to write — each naming its partition and file group — and writes the
entries that changed as the batch's delta. Under event time a deleted key keeps its ordering
value in state, without a location, so that an older version arriving in a later batch loses
as it would in the same batch. Error rows bypass the state: their packs are grouped by
``(True, "error-<first offset>")`` while records are grouped by ``(False, shard)``.

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
tasks pack their rows by shard (:func:`ingest.prepare.pack_by_shard`), the operator unpacks
a shard's blobs, tags them column-wise (keys with one version in the batch through
:func:`engine.merge.policy.resolve_single`, the others key by key) and emits them packed by file
group (:data:`TAGGED_SCHEMA`); the write tasks unpack them. State calls are a handful per
shard and batch. ``bench/ingest.py``'s global run and ``bench/global_index.py`` measure it
(``docs/benchmarks.md``). The number of shards is fixed for a checkpoint.

Requirements: ``spark.sql.streaming.stateStore.providerClass`` must be the RocksDB provider
(:func:`ensure_state_store`), and pyspark's state API needs ``protobuf`` (plus pandas and
pyarrow); ``grpcio`` is Spark Connect's (:func:`check_dependencies`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues

from engine.errors import InvalidOptionError, TerminalError
from engine.index.bucket import bucket_id, bucket_ids
from engine.index.relocation import Relocations
from engine.index.simple import ORDERING as LOC_ORDERING
from engine.index.simple import key_locations
from engine.layout.view import TableView
from engine.merge.policy import (
    ABSENT,
    DELETED,
    KIND_CODES,
    LIVE,
    KeyState,
    resolve_key,
    resolve_single,
    stays_in_place,
)
from engine.merge.resolve import ordering_column, ordering_column_type
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.storage import Storage
from engine.write.placement import bucket_group, live_buckets, unreplaced_generation
from ingest.prepare import (
    DELETE,
    FILE_ID,
    KAFKA_PARTITION,
    OFFSET,
    OP,
    ORDERING,
    ORDERING_NULL,
    ROWS,
    SHARD,
    SKIP,
    SPREAD,
    TOPIC,
    UPSERT,
    VALUE,
    pack_rows,
    packed_schema,
    shard_packed_schema,
    spark_schema,
    unpack_blobs,
)
from ingest.resolve import POLICY
from ingest.sink_config import DEFAULT_SHARDS, MAX_SHARDS
from ingest.state_index import (
    CHUNK_ROWS,
    FOLD_MIN_ROWS,
    MAX_DELTAS,
    Entry,
    Meta,
    ShardImage,
    base_slot,
    decode_blob,
    delta_slot,
    encode_blob,
    entries_table,
    key_digests,
    key_shards,
    live_entries_table,
    new_token,
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
    "GlobalIndexProcessor",
    "GlobalIndexSpec",
    "bootstrap_frame",
    "check_dependencies",
    "ensure_state_store",
    "tag_frame",
]

log = logging.getLogger(__name__)

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
    slim_schema: pa.Schema
    """Schema of the rows in and out (prepared slim rows)."""
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



_INITIAL_ROWS = shard_packed_schema().get_field_index(ROWS)
"""Where the packs are among the initial state's columns (pyspark names them by position)."""


class GlobalIndexProcessor(StatefulProcessor):
    """Tags a shard's keys with their file groups and keeps their locations in state.

    Executor side (one instance per task, built from a pickled :class:`GlobalIndexSpec`),
    entered once per shard and batch (:mod:`ingest.state_index`: the shard's state is a meta
    value plus blobs; the worker's image of it answers the lookups). Output rows (the slim
    schema): for each input row either the row to write — op ``UPSERT``/``DELETE`` with
    ``_hoodie_partition_path`` and the file group set — or op ``SKIP`` (a version that lost;
    kept for its Kafka offset); a key that moved partitions adds a ``DELETE`` of its old copy
    at the stored ordering value. Error rows pass through unchanged. Deterministic for a given
    input and state, so replays tag identically.
    """

    def __init__(self, spec: GlobalIndexSpec) -> None:
        self.spec = spec

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the shard's state (executor, and once on the driver for the schema)."""
        # pyspark warns that pandas >= 3 is not fully supported on every frame it converts.
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                                category=FutureWarning)
        self._meta = handle.getValueState(META_STATE, spark_schema(META_SCHEMA))
        self._blobs = handle.getMapState(BLOB_STATE, spark_schema(BLOB_KEY_SCHEMA),
                                         spark_schema(BLOB_VALUE_SCHEMA))
        self._moves: Relocations | None = None  # the table's clusterings, read once per task
        self._groups: dict[tuple[str, int, int], str] = {}

    def handleInitialState(self, key: Any, initialState: Any,
                           timerValues: TimerValues) -> None:
        """Seed a shard from the table scan (first batch of a new query only), a chunk a call.

        The rows come packed by shard, as :func:`bootstrap_frame` makes them: Arrow IPC
        streams of (key, partition path, file id, ordering value).
        """
        if not len(initialState):
            return
        shard = str(key[1])
        # pyspark names the initial state's columns by position
        rows = unpack_blobs(initialState.iloc[:, _INITIAL_ROWS].tolist())
        meta = Meta.from_row(self._meta.get())
        image = self._image(shard, meta)
        table = live_entries_table(image.schema, rows.column(RECORD_KEY),
                                   rows.column("partition_path"), rows.column("file_id"),
                                   rows.column("ordering"))
        for start in range(0, table.num_rows, CHUNK_ROWS):
            piece = table.slice(start, CHUNK_ROWS)
            self._blobs.updateValue((base_slot(meta.base_chunks),), (encode_blob(piece),))
            meta.base_chunks += 1
            meta.base_rows += piece.num_rows
        # The state is empty in the first batch but for earlier chunks: these join the base.
        token = new_token()
        meta.base_token = token
        image.add(table)
        image.token = token
        self._meta.update(meta.to_row())

    def handleInputRows(self, key: Any, rows: Iterator[Any],
                        timerValues: TimerValues) -> Iterator[Any]:
        """Tag one shard's rows of this batch and record the locations that changed.

        The rows come packed (:func:`ingest.prepare.pack_by_shard`: a few Arrow IPC streams
        per shard) and leave packed by file group (:data:`TAGGED_SCHEMA`), so that pyspark
        converts a handful of values per shard instead of every row's every column. Error
        rows pass through, packs unchanged, without state.
        """
        frame = self._input_frame(rows)
        if frame is None:
            return
        spreads, blobs = frame[SPREAD].tolist(), frame[ROWS].tolist()
        if bool(key[0]):
            yield _pandas().DataFrame({PARTITION_PATH: [None] * len(blobs),
                                       FILE_ID: [None] * len(blobs), SPREAD: spreads,
                                       ROWS: blobs}, columns=TAGGED_SCHEMA.names, dtype=object)
            return
        shard = str(key[1])
        meta = Meta.from_row(self._meta.get())
        image = self._image(shard, meta)
        tagged, changed, changes = self._tag_rows(unpack_blobs(blobs), image)
        if changed:
            delta = entries_table(image.schema, changed, changes)
            token, seq = new_token(), meta.next_delta
            self._blobs.updateValue((delta_slot(seq),), (encode_blob(delta),))
            meta.deltas.append((seq, token, delta.num_rows))
            meta.next_delta += 1
            image.add(delta)
            image.token = token
            if meta.due_for_fold(self.spec.fold_min_rows, self.spec.max_deltas):
                self._fold(meta, image)
            self._meta.update(meta.to_row())
        packed = pack_rows(tagged, keys={PARTITION_PATH: tagged.column(PARTITION_PATH),
                                         FILE_ID: tagged.column(FILE_ID)})
        # object columns: pyspark converts them to the declared types (None as null)
        yield _pandas().DataFrame({name: packed.column(name).to_pylist()
                                   for name in TAGGED_SCHEMA.names},
                                  columns=TAGGED_SCHEMA.names, dtype=object)

    def _tag_rows(self, rows: pa.Table, image: ShardImage
                  ) -> tuple[pa.Table, list[bytes], list[Entry | None]]:
        """Tag a shard's rows against its image: the rows to write (every input row, its op,
        partition, file group, ordering and value rewritten; a move's delete of the old copy
        appended) and the digests and entries of the keys whose entry changed.

        The rows are sorted by key and arrival (topic, Kafka partition, offset), so each
        key's versions are one run; the columns tagging rewrites become Python lists, the
        others stay Arrow."""
        spec = self.spec
        rows = rows.sort_by([(RECORD_KEY, "ascending"), (TOPIC, "ascending"),
                             (KAFKA_PARTITION, "ascending"), (OFFSET, "ascending")])
        n = rows.num_rows
        keys = rows.column(RECORD_KEY).combine_chunks()
        first = np.ones(n, dtype=bool)
        if n > 1:
            first[1:] = pc.not_equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(
                zero_copy_only=False)
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], n)
        unique = keys.take(pa.array(starts))
        cols: dict[str, np.ndarray] = {
            OP: rows.column(OP).to_numpy(zero_copy_only=False).copy(),
            PARTITION_PATH: _objects(rows.column(PARTITION_PATH)),
            FILE_ID: _objects(rows.column(FILE_ID))}
        if spec.event_time:
            cols[ORDERING] = _objects(rows.column(ORDERING))
            cols[ORDERING_NULL] = rows.column(ORDERING_NULL).to_numpy(
                zero_copy_only=False).copy()
        key_list = unique.to_pylist()
        digests = key_digests(key_list)
        stored = image.lookup(digests)
        buckets = self._buckets(unique)
        moves: list[tuple[int, str, str, Any]] = []
        changed: list[bytes] = []
        changes: list[Entry | None] = []
        single = self._single_versions(starts, ends, stored, buckets, cols)
        if len(single):
            self._tag_single(rows, single, starts[single], stored, buckets, cols, moves,
                             digests, changed, changes)
        rest = np.ones(len(starts), dtype=bool)
        rest[single] = False
        for j in np.flatnonzero(rest).tolist():
            change = self._tag(key_list[j], buckets[j], int(starts[j]), int(ends[j]),
                               stored[j], cols, moves)
            if change is not UNCHANGED:
                changed.append(digests[j])
                changes.append(change)  # type: ignore[arg-type]
        return _tagged_table(rows, cols, moves, event_time=spec.event_time), changed, changes

    def _single_versions(self, starts: np.ndarray, ends: np.ndarray,
                         stored: list[Entry | None], buckets: list[int | None],
                         cols: dict[str, np.ndarray]) -> np.ndarray:
        """The keys :meth:`_tag_single` tags (indices into the keys): one version in the batch,
        a bucket the vectorized rule judged, an ordering value if it is an upsert under event
        time, and — on a table that was clustered — neither their stored group nor their
        bucket's group replaced. The others go through :meth:`_tag`, key by key."""
        fast = (ends - starts == 1) & np.array([b is not None for b in buckets], dtype=bool)
        if self.spec.event_time:
            fast &= ~((cols[OP][starts] == UPSERT) & cols[ORDERING_NULL][starts])
        moves = self._relocations()
        if moves is not None and moves.lineage:  # the table was clustered
            parts = cols[PARTITION_PATH]
            for j in np.flatnonzero(fast).tolist():
                entry, part = stored[j], parts[starts[j]]
                bucket = buckets[j]
                assert bucket is not None
                if (entry is not None and entry[0] is not None and entry[1] is not None
                        and moves.lineage.is_replaced(entry[0], entry[1])) or (
                        part is not None and moves.lineage.is_replaced(
                            part, self._bucket_group(part, bucket))):
                    fast[j] = False
        return np.flatnonzero(fast)

    def _tag_single(self, rows: pa.Table, keys: np.ndarray, at: np.ndarray,
                    stored: list[Entry | None], buckets: list[int | None],
                    cols: dict[str, np.ndarray], moves: list[tuple[int, str, str, Any]],
                    digests: list[bytes], changed: list[bytes],
                    changes: list[Entry | None]) -> None:
        """:meth:`_tag` for keys with one version each (:meth:`_single_versions`; ``at``:
        their rows), column-wise: :func:`engine.merge.policy.resolve_single` decides, the
        placement follows the same rules."""
        spec = self.spec
        entries = [stored[j] for j in keys.tolist()]
        kind = np.array([KIND_CODES[ABSENT if e is None else LIVE if e[0] is not None
                                    else DELETED] for e in entries], dtype=np.int8)
        stored_part = np.array([None if e is None else e[0] for e in entries], dtype=object)
        stored_fid = np.array([None if e is None else e[1] for e in entries], dtype=object)
        stored_ordering = pa.array([None if e is None else e[2] for e in entries],
                                   spec.state_ordering_type) if spec.event_time else None
        orderings = None
        if spec.event_time:
            orderings = rows.column(ORDERING).take(pa.array(at)).combine_chunks().cast(
                spec.state_ordering_type)
        out = resolve_single(cols[OP][at] == DELETE, orderings,
                             cols[ORDERING_NULL][at] if spec.event_time else
                             np.ones(len(at), dtype=bool),
                             kind, stored_ordering, event_time=spec.event_time, policy=POLICY)
        live = kind == KIND_CODES[LIVE]
        upsert_wins = out.winner & (out.kind == KIND_CODES[LIVE])
        delete_wins = out.winner & (out.kind == KIND_CODES[DELETED])  # where it is stored
        target = cols[PARTITION_PATH][at]
        stays = upsert_wins & live & stays_in_place(
            stored_part, target, update_partition_path=spec.update_partition_path)
        moved = upsert_wins & live & ~stays
        in_place = stays | delete_wins
        part = np.where(in_place, stored_part, target)
        fid = np.where(in_place, stored_fid, cols[FILE_ID][at])
        for i in np.flatnonzero(upsert_wins & ~stays).tolist():  # new keys and moved ones
            bucket = buckets[keys[i]]
            assert bucket is not None
            fid[i] = self._bucket_group(target[i], bucket)
        op = np.full(len(at), SKIP, dtype=cols[OP].dtype)
        op[upsert_wins] = UPSERT
        op[delete_wins] = DELETE
        cols[OP][at] = op
        cols[PARTITION_PATH][at] = part
        cols[FILE_ID][at] = fid
        after: list[Any] = [None] * len(at)
        if spec.event_time:  # a winner is written at its (for a tombstone: the deleted) value
            assert out.ordering is not None and out.state_ordering is not None
            won = np.flatnonzero(out.winner)
            cols[ORDERING][at[won]] = _objects(out.ordering.take(pa.array(won)))
            cols[ORDERING_NULL][at[won]] = False
            after = out.state_ordering.to_pylist()
        for i in np.flatnonzero(moved).tolist():
            moves.append((int(at[i]), stored_part[i], stored_fid[i], entries[i][2]))
        deleted = KIND_CODES[DELETED]
        for i, (j, original, state, wins) in enumerate(zip(
                keys.tolist(), entries, out.kind.tolist(), upsert_wins.tolist(),
                strict=True)):
            if wins:
                entry: Entry | None = (part[i], fid[i], after[i])
            elif state == KIND_CODES[LIVE]:
                continue  # a version that lost to the live stored one
            elif state == deleted and spec.event_time and POLICY.remembers_deletes:
                entry = (None, None, after[i])
            else:
                entry = None
            if entry != original:
                changed.append(digests[j])
                changes.append(entry)

    def _buckets(self, keys: pa.Array) -> list[int | None]:
        """Every key's bucket (vectorized); None for keys only the scalar rule can judge —
        computed (or refused, naming the key) where one is needed."""
        try:
            return bucket_ids(keys, self.spec.num_buckets).tolist()
        except ValueError:
            return [None] * len(keys)

    def _input_frame(self, rows: Iterator[Any]) -> Any:
        """The shard's input as one pandas frame with the packed schema's column names
        (pyspark may name them _0, _1, ...; the two grouping columns after them are
        dropped)."""
        names = shard_packed_schema().names
        frames = [f.iloc[:, :len(names)] for f in rows if len(f)]
        if not frames:
            return None
        frame = frames[0] if len(frames) == 1 else _pandas().concat(frames, ignore_index=True)
        return frame.set_axis(names, axis=1)

    # -- the shard's state and this worker's image of it ------------------------------------

    def _image(self, shard: str, meta: Meta) -> ShardImage:
        """This worker's image of ``shard``, brought up to the state's version ``meta``:
        the deltas it has not applied, or — its token unknown to ``meta`` — rebuilt."""
        image = _IMAGES.get(self.spec.index_id, shard)
        if image is not None:
            missing = _missing_deltas(image.token, meta)
            if missing is not None:
                for seq, token, _ in missing:
                    image.add(decode_blob(self._blob(shard, delta_slot(seq))))
                    image.token = token
                return image
        image = ShardImage(self.spec.state_ordering_type)
        for chunk in range(meta.base_chunks):
            image.add(decode_blob(self._blob(shard, base_slot(chunk))))
        for seq, _, _ in meta.deltas:
            image.add(decode_blob(self._blob(shard, delta_slot(seq))))
        image.token = meta.token
        _IMAGES.put(self.spec.index_id, shard, image)
        return image

    def _blob(self, shard: str, slot: int) -> bytes:
        value = self._blobs.getValue((slot,))
        if value is None or value[0] is None:
            raise TerminalError(
                f"GLOBAL_STATE index: blob {slot} of shard {shard} is missing from the "
                "query's state (the checkpoint is damaged); start the query from a new "
                "checkpoint: its state is bootstrapped from the table")
        return bytes(value[0])

    def _fold(self, meta: Meta, image: ShardImage) -> None:
        """Write the image as the shard's new base and drop the deltas folded into it."""
        snapshot = image.snapshot()
        chunks = 0
        for start in range(0, snapshot.num_rows, CHUNK_ROWS):
            self._blobs.updateValue((base_slot(chunks),),
                                    (encode_blob(snapshot.slice(start, CHUNK_ROWS)),))
            chunks += 1
        for chunk in range(chunks, meta.base_chunks):
            self._blobs.removeKey((base_slot(chunk),))
        for seq, _, _ in meta.deltas:
            self._blobs.removeKey((delta_slot(seq),))
        meta.base_token, meta.base_chunks, meta.base_rows = image.token, chunks, snapshot.num_rows
        meta.deltas = []

    # -- tagging one key --------------------------------------------------------------------

    def _tag(self, key: str, bucket: int | None, first: int, end: int, stored: Entry | None,
             cols: dict[str, np.ndarray], moves: list[tuple[int, str, str, Any]]) -> object:
        """Tag one key's versions (rows ``first`` to ``end`` of ``cols``, in arrival order,
        rewritten in place) against its stored entry; return its new entry (None: the key
        leaves the state) or :data:`UNCHANGED`. A move (the key changed partitions) is
        appended to ``moves``: (winning row, stored partition, file id, ordering value)."""
        spec = self.spec
        op, part, fid_col = cols[OP], cols[PARTITION_PATH], cols[FILE_ID]
        ops: list[int] = op[first:end].tolist()
        orderings: list[Any]
        nulls: list[bool]
        if spec.event_time:
            orderings = cols[ORDERING][first:end].tolist()
            nulls = cols[ORDERING_NULL][first:end].tolist()
        else:
            orderings, nulls = [None] * len(ops), [True] * len(ops)
        original = stored
        if stored is not None and stored[0] is not None:  # where the key lives now
            assert stored[1] is not None
            stored = (stored[0], self._current_group(key, bucket, stored[0], stored[1]),
                      stored[2])
        if stored is None:
            before = KeyState()
        else:  # a deleted key keeps its ordering value, with no location
            kind = LIVE if stored[0] is not None else DELETED
            before = KeyState(kind, stored[2] if spec.event_time else None)
        outcome = resolve_key([o == DELETE for o in ops], orderings, nulls,
                              event_time=spec.event_time, policy=POLICY, stored=before)
        for i in range(first, end):  # every version but the winner writes nothing
            op[i] = SKIP
        after = outcome.state
        change: object = UNCHANGED
        if after.kind != LIVE:
            # Event time: a deleted key keeps the ordering value it was deleted at, so that an
            # older version arriving later loses, as it does in the table's readers.
            if after.kind == DELETED and spec.event_time and POLICY.remembers_deletes:
                change = (None, None, after.ordering)
            else:
                change = None
            if change == original:
                change = UNCHANGED
        if outcome.winner < 0:  # nothing to write (a live key is unchanged)
            return change
        w = first + outcome.winner
        if spec.event_time:  # a tombstone deletes at the deleted version's ordering value
            cols[ORDERING][w], cols[ORDERING_NULL][w] = outcome.ordering, False
        if after.kind == DELETED:  # the stored live copy is deleted where it is
            assert stored is not None and stored[0] is not None and stored[1] is not None
            op[w], part[w], fid_col[w] = DELETE, stored[0], stored[1]
            return change
        target = part[w]
        fid: str | None
        if stored is None or stored[0] is None:
            fid = self._new_key_group(key, bucket, target)
        elif stays_in_place(stored[0], target,
                            update_partition_path=spec.update_partition_path):
            target, fid = stored[0], stored[1]
        else:  # moved: delete the old copy at its ordering value, insert the new one
            assert stored[1] is not None
            moves.append((w, stored[0], stored[1], stored[2]))
            fid = self._new_key_group(key, bucket, target)
        op[w], part[w], fid_col[w] = UPSERT, target, fid
        entry = (target, fid, after.ordering)
        return UNCHANGED if entry == original else entry

    def _relocations(self) -> Relocations | None:
        spec = self.spec
        if spec.table_storage is None or spec.table_config is None:
            return None
        if self._moves is None:
            self._moves = Relocations.load(spec.table_storage, spec.table_config)
        return self._moves

    def _current_group(self, key: str, bucket: int | None, partition: str,
                       file_id: str) -> str:
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
            return self._new_key_group(key, bucket, partition)
        return found

    def _new_key_group(self, key: str, bucket: int | None, partition: str) -> str:
        """The group a key without a location goes to: its bucket's group, or — that one
        replaced by a clustering — the group holding the key if a replayed batch wrote it
        there before the clustering, else the bucket's next group never replaced."""
        if bucket is None:
            bucket = bucket_id(key, self.spec.num_buckets)
        group = self._bucket_group(partition, bucket)
        moves = self._relocations()
        if moves is None or not moves.lineage.is_replaced(partition, group):
            return group
        found = moves.locate(partition, group, key)
        if found is not None:
            return found
        known = bucket
        return unreplaced_generation(
            lambda generation: self._bucket_group(partition, known, generation),
            lambda file_id: moves.lineage.is_replaced(partition, file_id))

    def _bucket_group(self, partition: str, bucket: int, generation: int = 0) -> str:
        """The file group a new key of ``bucket`` goes to in ``partition``
        (:func:`engine.write.placement.bucket_group` over the live groups at query start),
        remembered per task (the id is a hash)."""
        cache = self._groups
        found = cache.get((partition, bucket, generation))
        if found is None:
            spec = self.spec
            found = cache[(partition, bucket, generation)] = bucket_group(
                spec.bucket_groups, spec.table_name, partition, bucket, generation)
        return found

    def close(self) -> None:
        """Nothing to release."""


UNCHANGED = object()
"""A key's entry stays as it is."""

TAGGED_SCHEMA = packed_schema([pa.field(PARTITION_PATH, pa.string()),
                               pa.field(FILE_ID, pa.string())])
"""What the state operator emits: tagged rows packed by file group (null: rows without one —
errors, versions that lost — spread by their first offset)."""


def _objects(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column as a numpy array of Python values (None for nulls), to rewrite in place."""
    values = np.empty(len(column), dtype=object)
    values[:] = column.to_pylist()
    return values


def _tagged_table(rows: pa.Table, cols: dict[str, np.ndarray],
                  moves: list[tuple[int, str, str, Any]], *, event_time: bool) -> pa.Table:
    """``rows`` with the tagged columns of ``cols``, values kept for upserts only (a version
    that lost or a delete writes no data), and a delete of the old copy per move."""
    def replaced(table: pa.Table, name: str, values: Any) -> pa.Table:
        i = table.schema.get_field_index(name)
        field = table.schema.field(i)
        return table.set_column(i, field, pa.array(values, field.type))

    for name, values in cols.items():
        rows = replaced(rows, name, values)
    upsert = pc.equal(rows.column(OP), UPSERT)
    value_at = rows.schema.get_field_index(VALUE)
    rows = rows.set_column(value_at, rows.schema.field(value_at),
                           pc.if_else(upsert, rows.column(VALUE), pa.scalar(None, pa.binary())))
    if not moves:
        return rows
    old = rows.take(pa.array([m[0] for m in moves], pa.int64()))
    old = replaced(old, OP, [DELETE] * len(moves))
    old = replaced(old, PARTITION_PATH, [m[1] for m in moves])
    old = replaced(old, FILE_ID, [m[2] for m in moves])
    old = replaced(old, VALUE, [None] * len(moves))
    if event_time:  # the old copy is deleted at the policy's value (its stored one)
        at = [POLICY.delete_ordering(m[3]) for m in moves]
        old = replaced(old, ORDERING, at)
        old = replaced(old, ORDERING_NULL, [a is None for a in at])
    return pa.concat_tables([rows, old])


class _ImageCache:
    """The shard images of this Python worker, for one index at a time (workers are reused
    across tasks and batches; an image is checked against the state before every use)."""

    def __init__(self) -> None:
        self._owner = ""
        self._images: dict[str, ShardImage] = {}

    def get(self, index_id: str, shard: str) -> ShardImage | None:
        return self._images.get(shard) if index_id == self._owner else None

    def put(self, index_id: str, shard: str, image: ShardImage) -> None:
        if index_id != self._owner:
            self._owner, self._images = index_id, {}
        self._images[shard] = image


_IMAGES = _ImageCache()


def _missing_deltas(token: str | None, meta: Meta) -> list[tuple[int, str, int]] | None:
    """The deltas an image at ``token`` lacks to be at ``meta``; None: it cannot catch up
    (its token is from a discarded state version, a folded delta or another query)."""
    if token == meta.token:
        return []
    if token is not None and token == meta.base_token:
        return meta.deltas
    for i, (_, delta_token, _) in enumerate(meta.deltas):
        if delta_token == token:
            return meta.deltas[i + 1:]
    return None


def _pandas() -> Any:
    """pandas, imported where the state operator runs (executors); untyped for mypy."""
    import pandas

    return pandas


def tag_frame(prepared: DataFrame, spec: GlobalIndexSpec, initial: DataFrame) -> DataFrame:
    """The streaming plan's tagging step: ``groupBy(shard).transformWithStateInPandas``.

    ``prepared``: rows packed by key shard (:func:`ingest.prepare.pack_by_shard`). The
    grouping key is (is error, shard) — error packs use ``error-<first offset>`` instead of
    a shard, and never touch the state. The result is packed by file group
    (:data:`TAGGED_SCHEMA`).
    """
    from pyspark.sql import functions as F

    keyed = prepared.withColumn(IS_ERROR, F.col(SHARD).isNull()).withColumn(
        GROUP, F.coalesce(F.col(SHARD).cast("string"),
                          F.concat(F.lit("error-"), F.col(SPREAD).cast("string"))))
    seeded = initial.withColumn(IS_ERROR, F.lit(False)).withColumn(
        GROUP, F.col(SHARD).cast("string"))
    return keyed.groupBy(IS_ERROR, GROUP).transformWithStateInPandas(
        GlobalIndexProcessor(spec), spark_schema(TAGGED_SCHEMA), "Append", "None",
        initialState=seeded.groupBy(IS_ERROR, GROUP))


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


BOOTSTRAP_PACK_AT = 500_000
"""A bootstrap task packs the locations it read by shard once it holds this many."""


def _packed_by_shard(parts: list[pa.Table], shards: int) -> Iterator[pa.RecordBatch]:
    rows = pa.concat_tables(parts)
    yield from pack_rows(rows, keys={SHARD: key_shards(rows.column(0), shards)}).to_batches()


def _read_locations(view: TableView, ordering_type: pa.DataType, shards: int
                    ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reader = view.slice_reader()
        slices = view.latest_file_slices()
        held: list[pa.Table] = []
        held_rows = 0
        for batch in batches:
            for i in batch.column(0).to_pylist():
                found = key_locations(reader, [slices[int(i)]], None)
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
    packed by key shard (:func:`ingest.prepare.pack_rows`: a few Arrow IPC streams of
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
    :func:`engine.write.placement.live_buckets`)."""
    return dict(live_buckets(TableView.load(table.storage, table.config),
                             table.write_config.index_type))

