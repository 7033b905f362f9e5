"""The metadata table's ``record_index`` partition (Hudi's record-level index, RFC-08): every
live record key → the data partition and file group holding it (``hudi-metadata-table.md``
§4.6; keys route to file groups by §4.8).

* **Built** when a writer wants it and the table lacks it (``hoodie.metadata.record.index.enable``,
  or ``hoodie.index.type=RECORD_INDEX``): every key of the latest file slices, read through the
  table's slice reader, pointing at its slice, ``instantTime`` = the slice's base instant (Java
  ``readRecordKeysFromFileSlices``). File group count: Hudi's ``estimateFileGroupCount``.
* **Kept** by the write handles, in the same commit as the data: a file that gains a key emits
  its new location, a file that loses one (delete, or the old copy of a key moved to another
  partition) its removal; an update in place emits nothing. Within one action a key's new
  location wins over its removal (:func:`engine.metadata.writer.write_deltacommit`), so a move
  is one upsert. Clustering emits the new location of every key it rewrites; compaction keeps
  file ids and emits nothing; a rolled-back instant's MDT deltacommit is taken back whole.
* **Looked up** and **read through**: :mod:`engine.metadata.record_index_lookup` (the MDT's
  read side; its names are re-exported here for the index and the Spark glue).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from engine.config import IndexType
from engine.metadata.index_defs import record_index_definition
from engine.metadata.indexes import IndexPartition, run_tasks
from engine.metadata.keys import RECORD_INDEX as RECORD_INDEX_TYPE

# the read side (record_index_lookup), re-exported for the index and the Spark glue
from engine.metadata.record_index_lookup import group_slices as group_slices
from engine.metadata.record_index_lookup import is_kept as is_kept
from engine.metadata.record_index_lookup import lookup_group as lookup_group
from engine.metadata.record_index_lookup import lookup_locations as lookup_locations
from engine.metadata.record_index_lookup import record_keys
from engine.metadata.records import (
    MetadataRecord,
    record_index_record,
)
from engine.metadata.update import SharedUpserts, with_update
from engine.schema import RECORD_KEY
from engine.storage import Storage

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.layout.file_group import FileSlice
    from engine.layout.view import TableView
    from engine.merge.record_merger import Layer
    from engine.metadata.update import MetadataUpdate
    from engine.read.slice_reader import SliceReader
    from engine.timeline.commit_metadata import WriteStat
    from engine.write.write_task import WriteContext, WriteTask

RECORD_INDEX = RECORD_INDEX_TYPE.name
"""The MDT partition name, ``record_index``."""
AVERAGE_RECORD_SIZE = 48
"""Bytes one record_index entry takes, Hudi's ``RECORD_INDEX_AVERAGE_RECORD_SIZE``."""

# -- which tables keep it, and its size ------------------------------------------------------

def wanted(write_config: WriteConfig) -> bool | None:
    """True with ``hoodie.index.type=RECORD_INDEX`` (the index needs it), else
    ``hoodie.metadata.record.index.enable`` (unset: None, keep what the table has)."""
    if write_config.index_type is IndexType.RECORD_INDEX:
        return True
    return write_config.record_index_enable


def estimate_file_group_count(record_count: int, *, min_groups: int, max_groups: int,
                              growth_factor: float, max_group_bytes: int,
                              average_record_size: int = AVERAGE_RECORD_SIZE) -> int:
    """Hudi's ``HoodieTableMetadataUtil.estimateFileGroupCount``: a fixed count when min = max,
    else ``ceil(records · growth) / (max bytes / record size)`` clamped to [min, max]."""
    if min_groups == max_groups and min_groups != 0:
        return min_groups
    # Java: (long) Math.ceil((float) recordCount * growthFactor), in float arithmetic.
    expected = math.ceil(float(_java_float(_java_float(record_count) * growth_factor)))
    per_group = max_group_bytes // max(average_record_size, 1)
    estimated = expected // per_group
    if estimated >= max_groups:
        return max_groups
    if estimated <= min_groups:
        return min_groups
    return max(1, int(estimated))


def _java_float(value: float) -> float:
    """``value`` rounded to a 32-bit float, as Java's ``float`` arithmetic keeps it."""
    import struct

    return float(struct.unpack("f", struct.pack("f", value))[0])


# -- building it from the table --------------------------------------------------------------

_BUILT: weakref.WeakKeyDictionary[TableView, list[MetadataRecord]] = weakref.WeakKeyDictionary()


def _all_records(view: TableView) -> list[MetadataRecord]:
    """Every key of the view's latest slices as a record_index record (read once per view:
    the group count and the build both need them)."""
    if view not in _BUILT:
        reader = view.slice_reader(use_threads=False)
        chunks = run_tasks(_slice_records, [(reader, slc) for slc in view.latest_file_slices()])
        _BUILT[view] = [record for chunk in chunks for record in chunk]
    return _BUILT[view]


def _slice_records(task: tuple[SliceReader, FileSlice]) -> list[MetadataRecord]:
    """The record_index records of one slice's keys (a build task; executor-safe)."""
    reader, slc = task
    keys = reader.read_slice(slc, columns=[RECORD_KEY]).column(RECORD_KEY)
    return _records(keys.combine_chunks().cast(pa.string()).to_pylist(),
                    slc.partition_path, slc.file_id, slc.base_instant)


def file_groups(view: TableView, write_config: WriteConfig) -> int:
    """The partition's file group count for the table ``view`` sees (Hudi's estimate)."""
    return estimate_file_group_count(
        len(_all_records(view)), min_groups=write_config.record_index_min_file_groups,
        max_groups=write_config.record_index_max_file_groups,
        growth_factor=write_config.record_index_growth_factor,
        max_group_bytes=write_config.record_index_max_file_group_bytes)


def build(view: TableView, write_config: WriteConfig) -> Iterable[MetadataRecord]:
    """Every record of the partition for the committed table ``view`` sees."""
    return _BUILT.pop(view, None) or _all_records(view)


PARTITION = IndexPartition(RECORD_INDEX, wanted, file_groups, build,
                           definition=lambda view, _wc: record_index_definition(
                               view.config.table_version))


# -- what a write emits ----------------------------------------------------------------------

def _records(keys: Iterable[str], partition: str, file_id: str,
             instant_time: str) -> list[MetadataRecord]:
    """record_index records of ``keys``, all pointing at one file group (the payload is
    built once, and shared)."""
    listed = keys if isinstance(keys, list) else list(keys)
    if not listed:
        return []
    template = record_index_record(listed[0], partition, file_id, instant_time)
    return SharedUpserts(pa.array(listed, pa.string()), template).records()


def _distinct(values: pa.Array | pa.ChunkedArray | None) -> pa.Array:
    """The distinct keys of a key column as a string array (empty for None)."""
    if values is None:
        return pa.array([], pa.string())
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    return pc.unique(values.cast(pa.string()))


def _not_in(keys: pa.Array, unless_in: pa.Array | None) -> pa.Array:
    """``keys`` not in ``unless_in``."""
    if unless_in is not None and len(unless_in) and len(keys):
        keys = keys.filter(pc.invert(pc.is_in(keys, value_set=unless_in)))
    return keys


def changes(partition: str, file_id: str, instant_time: str,
            inserted: pa.Array | Iterable[str], removed: Iterable[str]) -> MetadataUpdate | None:
    """The record_index entries of one written file: ``inserted`` keys (distinct; an Arrow
    string array stays one, see :class:`~engine.metadata.update.SharedUpserts`) now live in
    (``partition``, ``file_id``) since ``instant_time``; ``removed`` keys left it. None if
    neither."""
    from engine.metadata.update import MetadataUpdate

    keys = inserted if isinstance(inserted, pa.Array) else pa.array(list(inserted), pa.string())
    gone = list(removed)
    if not len(keys) and not gone:
        return None
    update = MetadataUpdate()
    if len(keys):
        update.add_shared(RECORD_INDEX, keys, record_index_record(
            keys[0].as_py(), partition, file_id, instant_time))
    if gone:
        update.delete(RECORD_INDEX, gone)
    return update


def base_file_changes(ctx: WriteContext, task: WriteTask, stat: WriteStat,
                      before: pa.Array | pa.ChunkedArray | None,
                      after: pa.Array | pa.ChunkedArray) -> WriteStat:
    """A new base file's entries (write handle, executor side): keys in ``after`` (the file
    written) and not in ``before`` (the base file it replaces, None for a new group) moved in,
    keys of ``before`` missing from ``after`` were deleted. Nothing unless the table keeps
    the partition."""
    if RECORD_INDEX not in ctx.metadata_partitions:
        return stat
    old, new = _distinct(before), _distinct(after)
    gone = _not_in(old, new)
    return with_update(stat, changes(task.partition_path, task.file_id, ctx.instant_time,
                                     _not_in(new, old),
                                     gone.take(pc.sort_indices(gone)).to_pylist()))


def log_file_changes(ctx: WriteContext, task: WriteTask, storage: Storage, stat: WriteStat,
                     new_layers: Sequence[Layer], schema: pa.Schema) -> WriteStat:
    """A new log file's entries (write handle, executor side): the keys it writes are merged
    with the slice it is written on, before and after (base file read for those keys only,
    the slice's log files decoded), so a key that becomes live in the group is an insert and
    a key that stops being live a delete, whatever the merge mode decides; updates in place
    emit nothing. An append of upserts whose task knows the keys its index located in the
    group (:attr:`~engine.write.write_task.WriteTask.located_keys`) reads nothing: the
    others are inserts, as Hudi's append handle reports them. Nothing unless the table keeps
    the partition."""
    if RECORD_INDEX not in ctx.metadata_partitions or not new_layers:
        return stat
    from engine.merge.record_merger import DataLayer

    written = [_distinct(layer.table.column(RECORD_KEY) if isinstance(layer, DataLayer)
                         else layer.keys) for layer in new_layers]
    touched = _distinct(pa.chunked_array(written, pa.string()))
    if task.located_keys is not None and all(isinstance(layer, DataLayer)
                                             for layer in new_layers):
        # Upserts only, tagged by the index: a located key stays live in its group (an
        # update, winning or not, never deletes), every other key enters it.
        return with_update(stat, changes(task.partition_path, task.file_id, ctx.instant_time,
                                         _not_in(touched, _distinct(task.located_keys)), ()))
    keys = touched.take(pc.sort_indices(touched))
    stored = _slice_layers(ctx, task, storage, keys, schema)
    before = _live(ctx, stored, [], schema)
    after = _live(ctx, stored, new_layers, schema)
    return with_update(stat, changes(task.partition_path, task.file_id, ctx.instant_time,
                                     sorted(after - before), sorted(before - after)))


def _slice_layers(ctx: WriteContext, task: WriteTask, storage: Storage, keys: pa.Array,
                  schema: pa.Schema) -> tuple[pa.Table | None, list[Layer]]:
    """The slice written on, restricted to ``keys``: its base file's rows of them (key and
    ordering columns) and its log blocks as merge layers, in log order."""
    from engine.format.base_file import read_base_file
    from engine.format.log_block import BlockType, iter_blocks
    from engine.format.log_format import decode_avro_data_block, decode_parquet_data_block
    from engine.merge.record_merger import DataLayer, DeleteLayer
    from engine.read.slice_reader import delete_columns

    columns = _columns(ctx)
    base = None
    if task.base_file:
        with storage.open_input(task.base_file) as source:
            base = read_base_file(source, columns=columns,
                                  filters=pc.field(RECORD_KEY).isin(keys), use_threads=False)
        base = _plain(base)
    layers: list[Layer] = []
    folder = f"{task.partition_path}/" if task.partition_path else ""
    for name in task.log_files:
        for block in iter_blocks(storage.read(folder + name)):
            if block.block_type is BlockType.AVRO_DATA:
                table = decode_avro_data_block(block, schema)
            elif block.block_type is BlockType.PARQUET_DATA:
                table = decode_parquet_data_block(block, use_threads=False)
            elif block.block_type is BlockType.DELETE:
                deleted, ordering = delete_columns(block)
                mask = pc.is_in(deleted.cast(pa.string()), value_set=keys)
                layers.append(DeleteLayer(deleted.filter(mask),
                                          ordering.filter(mask) if ordering is not None
                                          else None))
                continue
            else:
                continue
            table = _plain(table.select([c for c in columns if c in table.column_names]))
            layers.append(DataLayer(table.filter(pc.is_in(table.column(RECORD_KEY),
                                                          value_set=keys))))
    return base, layers


def _columns(ctx: WriteContext) -> list[str]:
    ordering = ctx.ordering_field
    return [RECORD_KEY] + ([ordering] if ordering and ordering in ctx.data_schema.names else [])


def _plain(table: pa.Table) -> pa.Table:
    """``table`` with its record key column as plain strings."""
    index = table.schema.get_field_index(RECORD_KEY)
    column = table.column(index)
    if not column.type.equals(pa.string()):
        table = table.set_column(index, pa.field(RECORD_KEY, pa.string()),
                                 column.cast(pa.string()))
    return table


def _live(ctx: WriteContext, stored: tuple[pa.Table | None, list[Layer]],
          extra: Sequence[Layer], schema: pa.Schema) -> set[str]:
    """Keys live after merging the slice's layers and ``extra``."""
    from engine.merge.record_merger import DataLayer, merge_layers

    base, layers = stored
    columns = _columns(ctx)
    extra = [DataLayer(_plain(layer.table.select(columns))) if isinstance(layer, DataLayer)
             else layer for layer in extra]
    out_schema = pa.schema([pa.field(RECORD_KEY, pa.string())]
                           + [schema.field(c) for c in columns[1:]])
    merged = merge_layers(base, [*layers, *extra], mode=ctx.merge_mode,
                          ordering_field=ctx.ordering_field, schema=out_schema)
    return record_keys(merged.column(RECORD_KEY))
