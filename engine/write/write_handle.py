"""Write handles: the executor-side work of one file group in one commit.

A :class:`WriteTask` says what to do with one file group — create a new base file, merge
records into its base file (copy-on-write), or append a log file (merge-on-read) — and
:func:`execute` does it and returns a :class:`~engine.timeline.commit_metadata.WriteStat`.

Contract for running inside Spark tasks: a ``WriteTask`` and a ``WriteContext`` are
plain picklable values; ``execute`` touches only the files of its own file group, writes
every file under a temporary name and publishes it whole, and never touches the
timeline. A task retried after a failure writes files under a new write token; the
files of the failed attempt are never referenced by the commit and are removed before the
instant completes (found by their markers, :mod:`engine.layout.markers`, which a handle
writes before its data file when :attr:`WriteContext.markers` asks) or when it is rolled
back, so readers never see them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import LogBlockFormat
from engine.errors import WriteConflictError
from engine.format.base_file import (
    DICTIONARY_SAMPLE_ROWS,
    dictionary_encoded,
    footer_keys,
    read_base_file_and_footer,
    write_base_file,
)
from engine.format.log_format import (
    encode_avro_data_block,
    encode_delete_block,
    encode_parquet_data_block,
)
from engine.format.naming import BaseFileName, new_log_file
from engine.layout import markers
from engine.layout.partition import write_partition_metadata
from engine.merge.record_merger import DataLayer, DeleteLayer, Layer, merge_layers
from engine.metadata import bloom_filters, record_index
from engine.metadata.column_stats import handle_update
from engine.metadata.file_stats import arrow_stats, base_file_stats
from engine.metadata.records import ColumnStats
from engine.metadata.update import merge_updates
from engine.schema import (
    FILE_NAME,
    LOW_CARDINALITY_META,
    META_FIELDS,
    PARTITION_PATH,
    RECORD_KEY,
    evolve_columns,
)
from engine.storage import Storage
from engine.timeline.commit_metadata import WriteStat
from engine.timeline.rollback_plan import discard_if_superseded
from engine.write.meta_columns import constant_strings, numbered_strings
from engine.write.write_task import APPEND, CREATE, MERGE, WriteContext, WriteTask

_DICT = pa.dictionary(pa.int32(), pa.string())

MERGE_BLOOM_ROOM = 1.5
"""A copy-on-write merge that must build its file's bloom filter anew sizes it for 1.5x the
file's keys (:meth:`~engine.format.bloom.BloomSizing.filter_for`): the next merges add
their inserts to it (``BloomSizing.extend``, only the new keys hashed) until the file grows
by half, instead of hashing every key of the file on each rewrite (a fifth of a merge's
time). Within ``extend``'s bound (rows at most 2x the file's keys); Java sizes every filter
for 60,000 keys whatever the file holds."""


def _constant(value: str, n: int, dictionary: bool) -> pa.Array:
    if dictionary:
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                              pa.array([value], pa.string()))
    return constant_strings(value, n)


def _meta_schema(ctx: WriteContext, dictionary: bool) -> pa.Schema:
    meta = [pa.field(m, _DICT if dictionary and m in LOW_CARDINALITY_META else pa.string())
            for m in META_FIELDS]
    return pa.schema(meta + list(ctx.data_schema))


def _with_meta(ctx: WriteContext, task: WriteTask, records: pa.Table, file_name: str,
               *, dictionary: bool = False) -> pa.Table:
    """Records with the five meta fields first, data columns in table order.

    With ``dictionary`` the low-cardinality meta columns are ``dictionary<string>`` (what
    base files are read and written with); log blocks take plain strings.
    """
    n = records.num_rows
    prefix = f"{ctx.instant_time}_{task.task_partition}_"
    seq = numbered_strings(prefix, n)
    partition = records.column(PARTITION_PATH)
    if dictionary:
        partition = partition.combine_chunks().dictionary_encode()
    columns = [_constant(ctx.instant_time, n, dictionary), seq, records.column(RECORD_KEY),
               partition, _constant(file_name, n, dictionary)]
    for f in ctx.data_schema:
        col = records.column(f.name)
        columns.append(col if col.type.equals(f.type) else col.cast(f.type))
    return pa.Table.from_arrays(columns, schema=_meta_schema(ctx, dictionary))


def _full_schema(ctx: WriteContext) -> pa.Schema:
    return _meta_schema(ctx, dictionary=True)


def _deletes_layer(ctx: WriteContext, deletes: pa.Table) -> DeleteLayer:
    ordering = None
    if ctx.ordering_field and ctx.ordering_field in deletes.column_names:
        ordering = deletes.column(ctx.ordering_field).combine_chunks()
    return DeleteLayer(deletes.column(RECORD_KEY).combine_chunks(), ordering)


def execute(ctx: WriteContext, task: WriteTask, *, sync: bool = False) -> WriteStat:
    """Run one write task; returns its write stat. Never touches the timeline; reads it
    once after publishing, and deletes its file and raises
    :class:`~engine.errors.WriteConflictError` if the instant was rolled back meanwhile.

    Files are published whole. ``sync=False``: not flushed; the committing writer flushes
    the file system once (:meth:`~engine.storage.Storage.sync`) before it completes the
    instant, which covers files written on its own machine only. ``sync=True``: every file
    this task publishes is fsynced, and its folder entry too, before this returns — for
    tasks that may run on other machines (Spark executors), whose files the committing
    driver cannot flush.
    """
    storage = ctx.storage
    if not task.partition_exists:
        write_partition_metadata(storage, task.partition_path, ctx.instant_time)
    if task.kind == APPEND:
        stat = _append(ctx, task, storage, sync)
    elif task.kind in (CREATE, MERGE):
        stat = _write_base(ctx, task, storage, sync)
    else:
        raise ValueError(f"kind: unknown write task kind {task.kind!r}")
    # A task still running after its instant was rolled back (its driver gave up, or
    # another writer judged it dead) removes what it published: nobody else will.
    if ctx.timeline_folder is not None:
        try:
            discard_if_superseded(storage, ctx.timeline_folder, ctx.instant_time, [stat.path])
        except WriteConflictError:
            if ctx.markers:  # the rollback may have deleted the marker folder before it
                storage.delete(markers.marker_path(ctx.instant_time, stat.path,
                                                   _io_type(task)))
            raise
    return stat


def _io_type(task: WriteTask) -> str:
    """The marker's I/O type of the task's data file (Hudi's ``IOType``)."""
    return {CREATE: markers.CREATE, MERGE: markers.MERGE, APPEND: markers.APPEND}[task.kind]


def _mark(ctx: WriteContext, task: WriteTask, rel: str, sync: bool) -> None:
    """Record ``rel`` in the instant's markers before its first byte is written (when the
    context asks for markers)."""
    if ctx.markers:
        markers.create_marker(ctx.storage, ctx.instant_time, rel, _io_type(task), fsync=sync)


def _rel(partition: str, name: str) -> str:
    return f"{partition}/{name}" if partition else name


def _write_base(ctx: WriteContext, task: WriteTask, storage: Storage,
                sync: bool) -> WriteStat:
    name = BaseFileName(task.file_id, task.write_token, ctx.instant_time).name
    rel = _rel(task.partition_path, name)
    _mark(ctx, task, rel, sync)
    schema = _full_schema(ctx)
    incoming = (_with_meta(ctx, task, task.records, name, dictionary=True)
                if task.records is not None and task.records.num_rows else None)
    num_deletes = 0
    updates = 0
    bloom = None
    dictionary_hint = None
    base_keys = None
    if task.kind == MERGE and task.base_file:
        old_bloom = None
        with storage.open_input(task.base_file) as source:
            base, footer = read_base_file_and_footer(source, LOW_CARDINALITY_META)
        # The rewritten file keeps the old one's dictionary columns (no sample to judge)
        # when the old file was judged on a full sample; a smaller one is judged again.
        if footer.num_rows >= DICTIONARY_SAMPLE_ROWS:
            dictionary_hint = dictionary_encoded(footer)
        if ctx.write_bloom_filter:
            old_bloom = footer_keys(footer, task.base_file).bloom
        base = evolve_columns(base, schema)  # rows of an older schema: nulls, widened types
        base_keys = base.column(RECORD_KEY).combine_chunks()
        layers: list[Layer] = []
        new_keys = None
        if incoming is not None:
            layers.append(DataLayer(incoming))
            incoming_keys = incoming.column(RECORD_KEY).combine_chunks()
            # The incoming keys the file holds, by a hash of the few incoming keys (not of
            # the file's many): the file's keys found among them, then those looked up.
            found = base_keys.filter(pc.is_valid(pc.index_in(base_keys,
                                                             value_set=incoming_keys)))
            existing = pc.is_in(incoming_keys, value_set=found)
            updates = int(pc.sum(existing).as_py() or 0)
            new_keys = incoming_keys.filter(pc.invert(existing))
        if task.deletes is not None and task.deletes.num_rows:
            layers.append(_deletes_layer(ctx, task.deletes))
        merged = merge_layers(base, layers, mode=ctx.merge_mode,
                              ordering_field=ctx.ordering_field, schema=schema)
        num_deletes = max(base.num_rows + (incoming.num_rows if incoming is not None else 0)
                          - updates - merged.num_rows, 0)
        # Rows kept from the old file keep commit time and seqno; only the file name moves.
        index = merged.schema.get_field_index(FILE_NAME)
        merged = merged.set_column(index, schema.field(FILE_NAME),
                                   _constant(name, merged.num_rows, True))
        out = merged
        if old_bloom is not None:
            # The old filter plus the new keys: a superset of this file's keys, far cheaper
            # than hashing every key again (deleted keys only add false positives), while
            # it stays sized for the file (BloomSizing.extend); else one built anew.
            bloom = ctx.bloom_sizing.extend(
                old_bloom, new_keys if new_keys is not None else pa.array([], pa.string()),
                out.num_rows)
        if bloom is None and ctx.write_bloom_filter and out.num_rows:
            # Built anew: with room for the next merges' inserts, which then extend it.
            bloom = ctx.bloom_sizing.filter_for(out.column(RECORD_KEY), room=MERGE_BLOOM_ROOM)
    else:
        out = incoming if incoming is not None else schema.empty_table()
    result = write_base_file(rel, out, bloom=ctx.write_bloom_filter,
                             compression=ctx.compression, bloom_filter=bloom,
                             bloom_sizing=ctx.bloom_sizing, fsync=sync, storage=storage,
                             dictionary_hint=dictionary_hint)
    inserts = (incoming.num_rows if incoming is not None else 0) - updates
    prev_base = task.base_file.rsplit("/", 1)[-1] if task.base_file else None
    update = None
    if ctx.column_stats_columns:
        with storage.open_input(rel, whole=False) as source:
            update = handle_update(task.partition_path, name,
                                   base_file_stats(source, ctx.column_stats_columns))
    stat = WriteStat(
        file_id=task.file_id, path=rel, partition_path=task.partition_path,
        prev_commit=task.base_instant or "null",
        num_writes=out.num_rows, num_deletes=num_deletes, num_update_writes=updates,
        num_inserts=max(inserts, 0), total_write_bytes=result.file_size,
        file_size_in_bytes=result.file_size, prev_base_file=prev_base,
        metadata=merge_updates(update, bloom_filters.file_update(
            ctx.metadata_partitions, task.partition_path, name, ctx.instant_time, result)),
    )
    return record_index.base_file_changes(ctx, task, stat, base_keys, out.column(RECORD_KEY))


def _append(ctx: WriteContext, task: WriteTask, storage: Storage, sync: bool) -> WriteStat:
    log_file = new_log_file(ctx.table_version, task.file_id, ctx.instant_time,
                            task.base_instant, task.log_files, task.write_token)
    name = log_file.name
    rel = _rel(task.partition_path, name)
    _mark(ctx, task, rel, sync)
    blocks: list[bytes] = []
    layers: list[Layer] = []
    n_records = 0
    n_deletes = 0
    stats = {c: ColumnStats(None, c, None, None, 0, 0, 0, 0) for c in ctx.column_stats_columns}
    if task.records is not None and task.records.num_rows:
        records = _with_meta(ctx, task, task.records, task.file_id)
        stats.update(arrow_stats(records, ctx.column_stats_columns))
        layers.append(DataLayer(records))
        if ctx.log_block_format is LogBlockFormat.PARQUET:
            blocks.append(encode_parquet_data_block(records, ctx.avro_schema_with_meta,
                                                    ctx.instant_time))
        else:
            blocks.append(encode_avro_data_block(records, ctx.avro_schema_with_meta,
                                                 ctx.instant_time))
        n_records = records.num_rows
    if task.deletes is not None and task.deletes.num_rows:
        blocks += _delete_blocks(ctx, task.deletes)
        layers.append(_deletes_layer(ctx, task.deletes))
        n_deletes = task.deletes.num_rows
    data = b"".join(blocks)
    storage.write_new(rel, data, fsync=sync)
    updates = min(task.num_updates, n_records)
    # As HoodieAppendHandle: prevCommit is the base instant of the slice written on (the new
    # instant for a group without a slice), baseFile its base file name ("" for a log-only
    # slice), logFiles the slice's log files followed by the one written now.
    base_name = task.base_file.rsplit("/", 1)[-1] if task.base_file else ""
    stat = WriteStat(
        file_id=task.file_id, path=rel, partition_path=task.partition_path,
        prev_commit=task.base_instant or ctx.instant_time, num_writes=n_records,
        num_deletes=n_deletes, num_update_writes=updates, num_inserts=n_records - updates,
        total_write_bytes=len(data), file_size_in_bytes=len(data),
        log_version=log_file.version,
        log_offset=0, base_file=base_name, log_files=(*task.log_files, name),
        total_log_blocks=len(blocks), total_log_records=n_records + n_deletes,
        metadata=handle_update(task.partition_path, name, stats) if stats else None,
    )
    return record_index.log_file_changes(ctx, task, storage, stat, layers,
                                         _meta_schema(ctx, False))


def _delete_blocks(ctx: WriteContext, deletes: pa.Table) -> list[bytes]:
    """Delete blocks for ``deletes``: one per ``orderingVal`` branch used.

    Natural-order deletes (null ordering value, ``IntWrapper(0)``) and deletes carrying an
    ordering value (the field's wrapper, e.g. ``LongWrapper``) go to separate blocks: hudi-rs
    reads a delete block's ordering values as one column and refuses a block that mixes
    wrapper types ("Delete block mixes ordering types").
    """
    keys = deletes.select([RECORD_KEY, PARTITION_PATH])
    ordering = None
    if ctx.ordering_field and ctx.ordering_field in deletes.column_names:
        ordering = deletes.column(ctx.ordering_field).combine_chunks()
    if ordering is None or ctx.ordering_avro_type is None or ordering.null_count == len(ordering):
        return [encode_delete_block(keys, ctx.instant_time, None, ctx.avro_schema_with_meta)]
    blocks = []
    natural = ordering.is_null()
    if ordering.null_count:
        blocks.append(encode_delete_block(keys.filter(natural), ctx.instant_time, None,
                                          ctx.avro_schema_with_meta))
    ordered = pc.invert(natural)
    blocks.append(encode_delete_block(
        keys.filter(ordered).append_column("ordering", ordering.filter(ordered)),
        ctx.instant_time, ctx.ordering_avro_type, ctx.avro_schema_with_meta))
    return blocks
