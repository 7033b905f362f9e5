"""The GLOBAL_STATE index's state operator: tags a shard's keys and keeps their locations.

:class:`GlobalIndexProcessor` is what ``transformWithStateInPandas`` runs for the index
(:mod:`ingest.global_index` says how the index works: shards, exactly once, bootstrapping,
clustering, cost); :func:`tag_frame` puts it in the streaming plan. Executor side but for
:func:`tag_frame`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues

from engine.errors import TerminalError
from engine.layout.incoming import bucket_id, key_buckets
from engine.merge.policy import (
    ABSENT,
    DELETED,
    KIND_CODES,
    LIVE,
    KeyState,
    deciding_rows,
    resolve_key,
    resolve_single,
    stays_in_place,
)
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.write.distributed import Relocations, bucket_group, unreplaced_generation
from ingest.ddl import spark_schema
from ingest.global_index import (
    BLOB_KEY_SCHEMA,
    BLOB_STATE,
    BLOB_VALUE_SCHEMA,
    GROUP,
    IS_ERROR,
    META_SCHEMA,
    META_STATE,
    TAGGED_SCHEMA,
    GlobalIndexSpec,
)
from ingest.resolve import POLICY
from ingest.rows import (
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
    release_task_memory,
    shard_packed_schema,
    unpack_blobs,
)
from ingest.state_index import (
    CHUNK_ROWS,
    Entry,
    Meta,
    ShardImage,
    base_slot,
    decode_blob,
    delta_slot,
    encode_blob,
    entries_table,
    key_digests,
    live_entries_table,
    new_token,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


__all__ = ["GlobalIndexProcessor", "tag_frame"]

log = logging.getLogger(__name__)

_INITIAL_ROWS = shard_packed_schema().get_field_index(ROWS)
"""Where the packs are among the initial state's columns (pyspark names them by position)."""


class GlobalIndexProcessor(StatefulProcessor):
    """Tags a shard's keys with their file groups and keeps their locations in state.

    Executor side (one instance per task, built from a pickled :class:`GlobalIndexSpec`),
    entered once per shard and batch (:mod:`ingest.state_index`: the shard's state is a meta
    value plus blobs; the worker's image of it answers the lookups). Output rows (the prepared
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

        The rows come packed (:func:`ingest.rows.pack_by_shard`: a few Arrow IPC streams
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
        at = self._deciding_versions(rows, starts, ends, cols)
        single = self._single_versions(at, stored, buckets, cols)
        if len(single):
            collapsed = single[ends[single] - starts[single] > 1]
            if len(collapsed):  # the versions that do not decide their key write nothing
                deciding = cols[OP][at[collapsed]]
                cols[OP][_runs(starts[collapsed], ends[collapsed])] = SKIP
                cols[OP][at[collapsed]] = deciding
            self._tag_single(rows, single, at[single], stored, buckets, cols, moves,
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

    def _deciding_versions(self, rows: pa.Table, starts: np.ndarray, ends: np.ndarray,
                           cols: dict[str, np.ndarray]) -> np.ndarray:
        """Per key (its rows ``starts`` to ``ends``, in arrival order), the row whose version
        alone decides the key as all its versions would, or -1 where none does (the key goes
        through :meth:`_tag`): :func:`engine.merge.policy.deciding_rows`."""
        event_time = self.spec.event_time
        return deciding_rows(starts, ends, cols[OP] == DELETE,
                             rows.column(ORDERING) if event_time else None,
                             cols[ORDERING_NULL] if event_time else None,
                             event_time=event_time)

    def _single_versions(self, at: np.ndarray, stored: list[Entry | None],
                         buckets: list[int | None], cols: dict[str, np.ndarray]) -> np.ndarray:
        """The keys :meth:`_tag_single` tags (indices into the keys): a version that decides
        the key alone (``at``, :meth:`_deciding_versions`), a bucket the vectorized rule
        judged, an ordering value if it is an upsert under event time, and — on a table that
        was clustered — neither their stored group nor their bucket's group replaced. The
        others go through :meth:`_tag`, key by key."""
        fast = (at >= 0) & np.array([b is not None for b in buckets], dtype=bool)
        rows = np.where(fast, at, 0)
        if self.spec.event_time:
            fast &= ~((cols[OP][rows] == UPSERT) & cols[ORDERING_NULL][rows])
        moves = self._relocations()
        if moves is not None and moves.lineage:  # the table was clustered
            parts = cols[PARTITION_PATH]
            for j in np.flatnonzero(fast).tolist():
                entry, part = stored[j], parts[at[j]]
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
            return key_buckets(keys, self.spec.num_buckets).to_pylist()
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
        """The task is over: hand back the memory its Arrow buffers and Python objects freed
        (:func:`ingest.rows.release_task_memory`; the shard images stay, they are the point)."""
        release_task_memory()


UNCHANGED = object()
"""A key's entry stays as it is."""

def _runs(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The positions ``starts[i]`` to ``ends[i] - 1`` of every run, in order."""
    sizes = ends - starts
    return np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))


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

    ``prepared``: rows packed by key shard (:func:`ingest.rows.pack_by_shard`). The
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
