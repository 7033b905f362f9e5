"""The RECORD_INDEX index in the streaming job: key locations from the metadata table's
``record_index`` partition, looked up in executor tasks.

Per micro-batch (after prepare; :meth:`ingest.sink.HudiStreamingSink._write_batch`):

1. driver: the record_index's file group slices of the instant's snapshot, one small
   listing of the metadata table, in a picklable
   :class:`~engine.write.distributed.RecordIndexTask` (``InstantWrite.record_index_task``);
2. executor tasks: the prepared rows are repartitioned by the record_index file group their
   key hashes to (``RecordIndexTask.group_indexes``), and each task looks its keys up in only
   those groups (``RecordIndexTask.lookup``: a base HFile through its block index, never a
   whole file; the engine's fallback reads the table while the partition is incomplete).
   :func:`tag_rows` then resolves each key's versions in the batch against what the table stores
   (:func:`engine.merge.resolve.resolve`) and tags the winner exactly as the engine's
   RECORD_INDEX/GLOBAL_SIMPLE write does (:meth:`engine.write.write_client.WriteClient.
   tag_located`): an update goes to the group holding its key, a key whose partition value
   changed is deleted there and inserted into its new partition (or, with
   ``hoodie.record.index.update.partition.path`` false, updated where it is stored: the
   engine's :func:`~engine.merge.policy.update_partition_path`), a delete goes to every
   group holding the key; under event time a move that loses to the stored version writes
   nothing, and an update in place is written without reading the stored version (if it
   loses, every merge keeps the stored one);
3. driver: the inserts per partition are counted and placed by the engine's upsert
   partitioner (:meth:`~engine.write.write_client.WriteClient.insert_buckets`: small file
   groups first, then new ones); a narrow step gives each insert its group
   (:func:`engine.write.partitioner.insert_file_ids`, a hash of its key: the same on replay);
4. the write tasks write the tagged rows as decided (:func:`ingest.spark_write.write_rows`),
   telling the engine which keys the lookup located in each group (:data:`~ingest.rows.LOCATED`,
   :func:`~ingest.rows.located_keys`: the ``located_keys`` of
   :meth:`engine.write.group_writer.GroupWriter.write`, as the write client's plan tells its
   tasks); their write handles emit the record_index entries of the keys that entered or
   left a group — a log append of upserts alone without reading the group's slice — and the
   commit writes them to the metadata table in the same instant.

The tagged rows are persisted between the count and the write, so Kafka is read once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import TableConfig
from engine.merge.resolve import ordering_column, resolve, tombstone_keys
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.write.distributed import InsertBucket, RecordIndexTask, TableView, insert_file_ids
from ingest.ddl import spark_schema
from ingest.resolve import POLICY, arrival_order
from ingest.rows import (
    DELETE,
    ERROR,
    FILE_ID,
    KAFKA_PARTITION,
    LOCATED,
    OFFSET,
    OP,
    ORDERING,
    ORDERING_NULL,
    SKIP,
    TOPIC,
    UPSERT,
    VERSIONS,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ingest.spark_write import InstantPlan

__all__ = ["MDT_GROUP", "TaggedBatch", "route_rows", "tag_batch", "tag_rows", "tagged_schema"]

MDT_GROUP = "_tl_mdt_group"
"""The record_index file group (index among the partition's groups) a row's key hashes to."""
_ROW = "_tl_row"


def tagged_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of prepared rows (``schema``) once tagged: with :data:`LOCATED`."""
    return schema.append(pa.field(LOCATED, pa.bool_()))


def _flagged(rows: pa.Table, located: bool) -> pa.Table:
    return rows.append_column(LOCATED, pa.array(np.full(rows.num_rows, located), pa.bool_()))


def route_rows(rows: pa.Table, task: RecordIndexTask) -> pa.Table:
    """``rows`` with :data:`MDT_GROUP`: the record_index group of their key (null for rows
    without one: errors). Executor side."""
    keys = rows.column(RECORD_KEY).to_pylist()
    ops = rows.column(OP).to_pylist()
    routed = [k is not None and op in (UPSERT, DELETE) for k, op in zip(keys, ops, strict=True)]
    values: list[int | None] = [None] * rows.num_rows
    if task.groups:
        wanted = [i for i, keep in enumerate(routed) if keep]
        indexes = task.group_indexes([keys[i] for i in wanted]).tolist()
        for i, index in zip(wanted, indexes, strict=True):
            values[i] = index
    return rows.append_column(MDT_GROUP, pa.array(values, pa.int32()))


def _stored(found: pa.Table, event_time: bool) -> dict[str, Any]:
    """Key → its stored ordering value in comparable form (None without event time), for
    :func:`engine.merge.resolve.resolve` (tombstones delete at it)."""
    keys = found.column("key").to_pylist()
    if not event_time or "loc_ordering" not in found.column_names:
        return dict.fromkeys(keys)
    values = found.column("loc_ordering").combine_chunks()
    return dict(zip(keys, ordering_column(values, values.type).to_pylist(), strict=True))


def _set(table: pa.Table, name: str, values: pa.Array | pa.Scalar) -> pa.Table:
    i = table.schema.get_field_index(name)
    field = table.schema.field(i)
    if isinstance(values, pa.Scalar):
        values = pa.array([values.as_py()] * table.num_rows, field.type)
    return table.set_column(i, field, values.cast(field.type))


def _written(rows: pa.Table, partition: str, file_id: str, op: int) -> pa.Table:
    rows = _set(rows, PARTITION_PATH, pa.scalar(partition))
    rows = _set(rows, FILE_ID, pa.scalar(file_id))
    return _set(rows, OP, pa.scalar(op, pa.int8()))


def tag_rows(rows: pa.Table, task: RecordIndexTask, view: TableView
             ) -> tuple[pa.Table, tuple[str, ...]]:
    """Tag prepared rows (all versions of their keys in the batch) against the record index:
    every input row comes back once with its Kafka coordinates — the winner of each key with
    the file group it writes (:data:`FILE_ID`; null for an insert, placed later) and whether
    the lookup located it there (:data:`LOCATED`), the other versions as ``SKIP`` — plus,
    without coordinates, the extra rows a write needs (the delete of a moved key's old copy,
    a second copy of a key stored twice). Returns them (:func:`tagged_schema`) and the
    record_index file groups read. Executor side."""
    schema = tagged_schema(rows.schema)
    ops = rows.column(OP).combine_chunks()
    work_mask = pc.is_in(ops, pa.array([UPSERT, DELETE], ops.type))
    others = _flagged(rows.filter(pc.invert(work_mask)), False)
    work = rows.filter(work_mask)
    if not work.num_rows:
        return others, ()
    work = work.append_column(_ROW, pa.array(np.arange(work.num_rows, dtype=np.int64)))
    keys = pc.unique(work.column(RECORD_KEY).combine_chunks())
    event_time = task.config.orders_by_event_time
    upserts = work.filter(pc.equal(work.column(OP), UPSERT))
    found, read = task.lookup(
        view, keys, upsert_keys=upserts.column(RECORD_KEY).combine_chunks(),
        upsert_partitions=upserts.column(PARTITION_PATH).combine_chunks(),
        tombstoned=tombstone_keys(work, VERSIONS, event_time=True))
    resolved = resolve(arrival_order(work), columns=VERSIONS, event_time=event_time,
                       policy=POLICY, stored=_stored(found, event_time))
    out: list[pa.Table] = []
    in_place: list[bool] = []  # per table of out: updates the lookup located there
    if resolved.upserts.num_rows:
        tagged = task.tag_upserts(view, resolved.upserts, found)
        for (part, fid), piece in sorted(tagged.updates.items()):
            out.append(_written(piece, part, fid, UPSERT))
            in_place.append(True)
        for (part, fid), piece in sorted(tagged.moved_out.items()):
            out.append(_moved_out(piece, part, fid, work.schema, task.config))
            in_place.append(False)
        if tagged.inserts.num_rows:
            out.append(_set(tagged.inserts, FILE_ID, pa.scalar(None, pa.string())))
            in_place.append(False)
    deletes = resolved.deletes
    if deletes.num_rows:
        located = task.delete_locations(deletes.column(RECORD_KEY).combine_chunks(), found)
        hit = located.filter(pc.is_valid(located.column("loc_file_id")))
        if hit.num_rows:
            piece = deletes.take(hit.column("row"))
            piece = _set(piece, PARTITION_PATH, hit.column("loc_partition").combine_chunks())
            piece = _set(piece, FILE_ID, hit.column("loc_file_id").combine_chunks())
            out.append(piece)
            in_place.append(False)
    written = pa.concat_tables(
        [_flagged(t.select(work.schema.names).cast(work.schema), flag)
         for t, flag in zip(out, in_place, strict=True)]
        or [_flagged(work.schema.empty_table(), False)])
    # The first written row of a winner keeps its Kafka coordinates; every other version of
    # the batch is a SKIP row kept for its offset; extra rows carry none.
    ids = written.column(_ROW).to_numpy(zero_copy_only=False)
    valid = pc.is_valid(written.column(_ROW)).to_numpy(zero_copy_only=False)
    first = np.zeros(written.num_rows, dtype=bool)
    seen: set[int] = set()
    for i in np.flatnonzero(valid).tolist():
        if int(ids[i]) not in seen:
            seen.add(int(ids[i]))
            first[i] = True
    for name in (TOPIC, KAFKA_PARTITION, OFFSET):
        field = written.schema.field(name)
        written = _set(written, name, pc.if_else(pa.array(first), written.column(name),
                                                 pa.scalar(None, field.type)))
    skipped = work.filter(pc.invert(pc.is_in(work.column(_ROW),
                                             pa.array(sorted(seen), pa.int64()))))
    skipped = _flagged(_set(skipped, OP, pa.scalar(SKIP, pa.int8())), False)
    tables = [t.drop_columns([_ROW]).select(schema.names).cast(schema)
              for t in (written, skipped)]
    return pa.concat_tables([others, *tables]), read


def _moved_out(deletes: pa.Table, partition: str, file_id: str, schema: pa.Schema,
               config: TableConfig) -> pa.Table:
    """Prepared rows deleting the old copies of moved keys (the engine's deletes: key,
    partition and, if the delete policy gives one, the ordering value)."""
    n = deletes.num_rows
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns[RECORD_KEY] = deletes.column(RECORD_KEY).combine_chunks().cast(pa.string())
    columns[PARTITION_PATH] = pa.array([partition] * n, pa.string())
    columns[FILE_ID] = pa.array([file_id] * n, pa.string())
    columns[OP] = pa.array([DELETE] * n, pa.int8())
    ordering = config.precombine_field
    if ORDERING in schema.names:
        if ordering and ordering in deletes.column_names:
            values = deletes.column(ordering).combine_chunks()
            columns[ORDERING] = ordering_column(values, values.type).cast(
                schema.field(ORDERING).type)
            columns[ORDERING_NULL] = pc.is_null(columns[ORDERING])
        else:
            columns[ORDERING_NULL] = pa.array([True] * n, pa.bool_())
    return pa.table(columns, schema=schema)


# --- Spark (driver side) ---------------------------------------------------------------------


class _GroupsRead:
    """Accumulator param: the record_index file group ids the tagging tasks read."""

    def zero(self, value: list[str]) -> list[str]:
        return []

    def addInPlace(self, a: list[str], b: list[str]) -> list[str]:
        return a + b


@dataclass
class TaggedBatch:
    """The batch's rows tagged and placed, ready for the write tasks (persisted until
    :meth:`release`)."""

    rows: DataFrame
    groups: int
    """The record_index's file group count (routing modulus)."""
    _tagged: DataFrame
    _read: Any

    @property
    def groups_read(self) -> tuple[str, ...]:
        """Record_index file group ids the tagging tasks read (one entry per task and group;
        a task retried reads again)."""
        return tuple(self._read.value)

    def release(self) -> None:
        self._tagged.unpersist()


def tag_batch(rows: DataFrame, plan: InstantPlan, schema: pa.Schema, *,
              parallelism: int) -> TaggedBatch:
    """Tag a batch's prepared rows (unpacked, with data; Arrow ``schema``) against the
    record index in executor tasks, count and place the inserts, and return the rows for
    :func:`ingest.spark_write.write_rows` (``decided=True``). Driver side: two Spark jobs
    (tag and count; the rows are persisted), the write is the third."""
    from pyspark.sql import functions as F

    task = plan.write.record_index_task()
    spark = rows.sparkSession
    sc = spark.sparkContext
    view = sc.broadcast(plan.view)
    read: Any = sc.accumulator([], _GroupsRead())  # type: ignore[arg-type]
    with_group = schema.append(pa.field(MDT_GROUP, pa.int32()))
    out_schema = tagged_schema(schema)
    groups = task.groups

    def add_group(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield from route_rows(pa.Table.from_batches([batch]), task).to_batches()

    def tag_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = [b for b in batches if b.num_rows]
        if not collected:
            return
        table = pa.Table.from_batches(collected).drop_columns([MDT_GROUP])
        tagged, groups_read = tag_rows(table.cast(schema), task, view.value)
        read.add(list(groups_read))
        yield from tagged.to_batches()

    routed = rows.mapInArrow(add_group, spark_schema(with_group))
    shuffled = routed.repartition(parallelism, F.col(MDT_GROUP),
                                  F.when(F.col(OP) == ERROR, F.col(OFFSET)))
    tagged = shuffled.mapInArrow(tag_task, spark_schema(out_schema)).persist()
    try:
        counts = {r[PARTITION_PATH]: int(r["count"]) for r in
                  tagged.where((F.col(OP) == UPSERT) & F.col(FILE_ID).isNull())
                  .groupBy(PARTITION_PATH).count().collect()}
        buckets = plan.write.insert_buckets(counts)
        placed = tagged.mapInArrow(_place_inserts(_plain(buckets)), spark_schema(out_schema))
    except BaseException:
        tagged.unpersist()
        raise
    finally:
        view.unpersist()
    return TaggedBatch(placed, groups, tagged, read)


def _plain(buckets: Mapping[str, list[InsertBucket]]) -> dict[str, list[InsertBucket]]:
    """Insert buckets without their slices (only ids and counts cross to the tasks)."""
    return {part: [InsertBucket(b.partition_path, b.file_id, b.count, None) for b in found]
            for part, found in buckets.items()}


def _place_inserts(buckets: Mapping[str, list[InsertBucket]]
                   ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield from place_inserts(pa.Table.from_batches([batch]), buckets).to_batches()
    return run


def place_inserts(rows: pa.Table, buckets: Mapping[str, list[InsertBucket]]) -> pa.Table:
    """Fill :data:`FILE_ID` of inserts (upserts without one) from their partition's insert
    buckets (:func:`engine.write.partitioner.insert_file_ids`). Executor side."""
    fids = rows.column(FILE_ID).combine_chunks()
    todo = pc.and_(pc.equal(rows.column(OP), UPSERT), pc.is_null(fids))
    if not pc.any(todo).as_py():
        return rows
    out = fids.to_pylist()
    parts = rows.column(PARTITION_PATH).combine_chunks()
    keys = rows.column(RECORD_KEY).combine_chunks()
    at = np.flatnonzero(todo.to_numpy(zero_copy_only=False))
    by_part: dict[str, list[int]] = {}
    for i, part in zip(at.tolist(), parts.take(pa.array(at)).to_pylist(), strict=True):
        by_part.setdefault(part, []).append(i)
    for part, positions in by_part.items():
        placed = insert_file_ids(keys.take(pa.array(positions)), buckets[part]).to_pylist()
        for i, fid in zip(positions, placed, strict=True):
            out[i] = fid
    return _set(rows, FILE_ID, pa.array(out, pa.string()))
