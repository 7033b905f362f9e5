"""Reading one file slice: its base file, and for merge-on-read its log blocks merged by key
(:mod:`engine.merge.record_merger`), under a fixed set of visible instants.

:class:`SliceReader` is hudi-rs's ``FileGroupReader`` (``crates/core/src/file_group/reader.rs``)
and Java Hudi's ``HoodieFileGroupReader``: given a slice, the storage, the instants a read sees
and the table schema, it reads the slice; it knows nothing of views, planning or data skipping.
It sits below the table view (:mod:`engine.layout.view`), as hudi-rs's ``file_group`` sits
below ``table::fs_view``: the view hands out slices and, for its callers' convenience, a reader
of them (:meth:`~engine.layout.view.TableView.slice_reader`). Planned reads
(:mod:`engine.read.scan`, :mod:`engine.read.reader`) and the writers build on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from engine.format.base_file import read_base_file, read_base_file_keys
from engine.format.log_format import (
    BlockType,
    HeaderKey,
    LogBlock,
    decode_avro_data_block,
    decode_delete_block,
    decode_parquet_data_block,
    iter_blocks,
)
from engine.layout.file_group import FileSlice
from engine.merge.record_merger import DataLayer, DeleteLayer, Layer, merge_layers
from engine.schema import LOW_CARDINALITY_META, RECORD_KEY, evolve_columns
from engine.storage import Storage
from engine.timeline.active import Timeline


class SliceReader:
    """Reads file slices of one table under a fixed set of visible instants."""

    def __init__(self, storage: Storage, timeline: Timeline, visible: Mapping[str, str],
                 schema: pa.Schema | None, *, use_threads: bool = True) -> None:
        self.storage = storage
        self.timeline = timeline
        self.config = timeline.config
        self.visible = visible
        self.schema = schema
        self.use_threads = use_threads
        """False when the caller reads several slices at once: parquet is then decoded on the
        calling thread (see :func:`engine.format.base_file.read_base_file`)."""

    def read_slice(self, slc: FileSlice, *, read_optimized: bool = False,
                   columns: Sequence[str] | None = None,
                   keys: pa.Array | None = None) -> pa.Table:
        """The merged rows of one slice (columns=None: all columns).

        ``keys`` restricts the read to those record keys. Merging is per key, so dropping
        other keys before the merge gives the same rows for these keys: the base file is read
        by key (:func:`~engine.format.base_file.read_base_file_keys`: the key column, then
        only the row groups holding the keys), and log records
        of other keys are dropped before merging.

        A slice with log files is merged by the table's rule, so the ordering field is read
        for the merge whatever ``columns`` asks for (and left out of the result if not asked
        for): without it an event-time merge would judge versions and deletes on nothing.
        Every caller reading keys only (the record index's build and ``metadata validate``,
        the simple index) gets the keys a full read finds live.
        """
        merged = not read_optimized and bool(slc.log_files)
        asked = columns
        columns = self._merge_columns(columns) if merged else columns
        base: pa.Table | None = None
        if slc.base_file is not None:
            wanted = [c for c in LOW_CARDINALITY_META if columns is None or c in columns]
            by_key = keys is not None and (columns is None or RECORD_KEY in columns)
            # A read of some columns or by key fetches the footer and the chunks it needs
            # (ranged on an object store); a read of every row and column, the whole file
            # (one request).
            whole = columns is None and keys is None
            with self.storage.open_input(slc.base_file.path, whole=whole) as source:
                if by_key:
                    assert keys is not None
                    base = read_base_file_keys(source, keys, columns=columns,
                                               dictionary_columns=wanted,
                                               use_threads=self.use_threads)
                else:
                    key_filter = pc.field(RECORD_KEY).isin(keys) if keys is not None else None
                    base = read_base_file(source, columns=columns, dictionary_columns=wanted,
                                          filters=key_filter, use_threads=self.use_threads)
        if base is not None:
            # A file written before the table's schema evolved: null for the columns added
            # since, widened values (the log blocks below decode into this schema too).
            base = evolve_columns(base, self._wanted(columns))
        schema = base.schema if base is not None else self._wanted(columns)
        if read_optimized or not slc.log_files:
            if base is None:
                return (schema or pa.schema([])).empty_table()
            return base
        layers = self.log_layers(slc, schema)
        if keys is not None:
            layers = [_only_keys(layer, keys) for layer in layers]
        if not self.config.populate_meta_fields:
            # No record keys stored: readers treat the table as append-only.
            data = [base] if base is not None else []
            data += [lay.table for lay in layers if isinstance(lay, DataLayer)]
            return _only_columns(pa.concat_tables(data, promote_options="permissive"), asked) \
                if data else pa.table({})
        if schema is None:
            tables = [lay.table for lay in layers if isinstance(lay, DataLayer)]
            if not tables:
                return pa.table({})
            schema = tables[0].schema
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns if c in schema.names])
        return _only_columns(merge_layers(base, layers, mode=self.config.merge_mode,
                                          ordering_field=self.config.precombine_field,
                                          schema=schema), asked)

    def _merge_columns(self, columns: Sequence[str] | None) -> Sequence[str] | None:
        """``columns`` and the ordering field, when an event-time merge needs it and the
        table has it."""
        ordering = self.config.precombine_field
        if columns is None or not ordering or ordering in columns \
                or not self.config.orders_by_event_time \
                or (self.schema is not None and ordering not in self.schema.names):
            return columns
        return [*columns, ordering]

    def _wanted(self, columns: Sequence[str] | None) -> pa.Schema | None:
        """The table schema's fields a read of ``columns`` returns (None: all of them)."""
        if self.schema is None or columns is None:
            return self.schema
        return pa.schema([f for f in self.schema if f.name in columns])

    def log_layers(self, slc: FileSlice, schema: pa.Schema | None) -> list[Layer]:
        """The slice's log blocks as merge layers, in the slice's log order (rolled-back
        blocks dropped); what :meth:`read_slice` merges onto the base file, and compaction too."""
        blocks: list[LogBlock] = []
        for log in slc.log_files:
            data = self.storage.read(log.path)
            blocks.extend(iter_blocks(data))
        # (a log file named by its slice holds blocks of several instants: each is checked)
        v6 = self.config.table_version.logs_named_by_slice
        rolled_back = {b.header.get(HeaderKey.TARGET_INSTANT_TIME) for b in blocks
                       if b.block_type is BlockType.COMMAND}
        # Meta columns the merge wants as dictionaries (as the base file is read) are decoded
        # as such, instead of decoded as strings and cast.
        dictionary = [f.name for f in schema or () if f.name in LOW_CARDINALITY_META
                      and pa.types.is_dictionary(f.type)]
        layers: list[Layer] = []
        for block in blocks:
            if block.block_type is BlockType.COMMAND:
                continue
            instant = block.header.get(HeaderKey.INSTANT_TIME, "")
            if instant in rolled_back:
                continue
            if v6 and instant not in self.visible:
                continue  # written by an instant that never completed (or is too new)
            if block.block_type is BlockType.AVRO_DATA:
                layers.append(DataLayer(decode_avro_data_block(block, schema)))
            elif block.block_type is BlockType.PARQUET_DATA:
                layers.append(DataLayer(evolve_columns(decode_parquet_data_block(
                    block, use_threads=self.use_threads, dictionary_columns=dictionary),
                    schema)))
            elif block.block_type is BlockType.DELETE:
                keys, ordering = delete_columns(block)
                layers.append(DeleteLayer(keys, ordering))
        return layers


def _only_columns(table: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    """``table`` without the columns a merge read beyond ``columns`` (None: all)."""
    if columns is None:
        return table
    kept = [c for c in table.column_names if c in columns]
    return table if len(kept) == table.num_columns else table.select(kept)


def _only_keys(layer: Layer, keys: pa.Array) -> Layer:
    if isinstance(layer, DataLayer):
        return DataLayer(layer.table.filter(pc.is_in(layer.table.column(RECORD_KEY),
                                                     value_set=keys)))
    mask = pc.is_in(layer.keys, value_set=keys)
    ordering = layer.ordering.filter(mask) if layer.ordering is not None else None
    return DeleteLayer(layer.keys.filter(mask), ordering)


def dictionary_meta(table: pa.Table) -> pa.Table:
    """Low-cardinality meta columns as ``dictionary<string>``, as base files are read."""
    for name in LOW_CARDINALITY_META:
        if name not in table.column_names:
            continue
        index = table.column_names.index(name)
        column = table.column(index)
        if not pa.types.is_dictionary(column.type):
            encoded = column.combine_chunks().dictionary_encode()
            table = table.set_column(index, pa.field(name, encoded.type), encoded)
    return table


def delete_columns(block: LogBlock) -> tuple[pa.Array, pa.Array | None]:
    """Keys and ordering values of a delete block."""
    records = decode_delete_block(block)
    if isinstance(records, pa.Table):
        keys = records.column(RECORD_KEY).combine_chunks()
        ordering = (records.column("ordering").combine_chunks()
                    if "ordering" in records.column_names else None)
        return keys, ordering
    keys = pa.array([r.record_key for r in records], pa.string())
    values = [r.ordering_value for r in records]
    try:
        ordering = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        ordering = None
    return keys, ordering


__all__ = ["SliceReader", "delete_columns", "dictionary_meta"]
