"""Column statistics of data files, as the ``column_stats`` and ``partition_stats`` partitions of
the metadata table keep them (``hudi-metadata-table.md`` §4.3, §4.4): which columns are
indexed, the stats of one file, and the union of several files' stats. The two partitions
(:mod:`engine.metadata.column_stats`, :mod:`engine.metadata.partition_stats`) build on this
module; neither imports the other.

Where the stats come from, as Hudi's (the Spark sample's records are reproduced by the
tests):

* base files: the Parquet footer of the file just written (row-group statistics summed:
  ``valueCount`` = values incl. nulls, ``totalSize``/``totalUncompressedSize`` = the column
  chunks' compressed/uncompressed sizes) — no data read;
* log files: the records of their data blocks (``pyarrow.compute.min_max``), sizes 0; a log
  holding only deletes gets null min/max and ``valueCount`` 0.

Columns (``HoodieTableMetadataUtil.getColumnsToIndex``): ``_hoodie_commit_time``,
``_hoodie_partition_path``, ``_hoodie_record_key`` (tables with meta fields), then
``hoodie.metadata.index.column.stats.column.list`` if set, else the first
``hoodie.metadata.index.column.stats.max.columns.to.index`` data columns of a supported
type (not nested, binary, decimal — Spark's Avro decimals are ``fixed``, unsupported — nor
time of day).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.format.base_file import parquet_file
from engine.format.naming import parse_base_file, parse_log_file
from engine.metadata.records import (
    ColumnStats,
    StatValue,
    ValueTypeInfo,
    bounds_unknown,
    pick_bound,
    wrap_stat_value,
)
from engine.schema import COMMIT_TIME, META_FIELDS, PARTITION_PATH, RECORD_KEY

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.layout.file_group import FileSlice
    from engine.layout.view import TableView
    from engine.storage import Storage

META_COLUMNS_TO_INDEX = (COMMIT_TIME, PARTITION_PATH, RECORD_KEY)
"""Meta columns always indexed (Java ``META_COLS_TO_ALWAYS_INDEX``, in its TreeMap order)."""
DEFAULT_MAX_COLUMNS = 32

__all__ = [
    "arrow_stats",
    "base_file_stats",
    "columns_to_index",
    "configured_columns",
    "file_stats",
    "footer_stats",
    "log_file_stats",
    "merge_bounds",
    "table_columns",
    "table_file_stats",
]


# -- which columns ----------------------------------------------------------------------------

def supported_type(t: pa.DataType) -> bool:
    """Whether Hudi indexes a column of this type (``isColumnTypeSupported`` for Spark
    records: no nested, binary/fixed (so no decimals) types; time of day left out here)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_date(t)
            or pa.types.is_timestamp(t))


def columns_to_index(data_schema: pa.Schema, column_list: Sequence[str] | None = None,
                     max_columns: int = DEFAULT_MAX_COLUMNS, *,
                     populate_meta_fields: bool = True) -> tuple[str, ...]:
    """The columns whose stats are kept, in Hudi's order (module docstring).
    ``data_schema``: data columns (meta fields, if there, are skipped)."""
    meta = META_COLUMNS_TO_INDEX if populate_meta_fields else ()
    fields = {f.name: f.type for f in data_schema if f.name not in META_FIELDS}
    if column_list:
        chosen = [c for c in column_list
                  if c not in META_COLUMNS_TO_INDEX and c in fields and supported_type(fields[c])]
    else:
        chosen = [n for n, t in fields.items() if supported_type(t)][:max_columns]
    return tuple(dict.fromkeys([*meta, *chosen]))


def configured_columns(data_schema: pa.Schema, write_config: WriteConfig | None,
                       populate_meta_fields: bool = True) -> tuple[str, ...]:
    """:func:`columns_to_index` with a writer's options (Hudi's defaults without one)."""
    if write_config is None:
        return columns_to_index(data_schema, populate_meta_fields=populate_meta_fields)
    return columns_to_index(data_schema, write_config.column_stats_columns or None,
                            write_config.column_stats_max_columns,
                            populate_meta_fields=populate_meta_fields)


# -- stats of one file ------------------------------------------------------------------------

def _value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _micros(value: Any, t: pa.DataType, *, up: bool) -> int:
    """A timestamp bound in microseconds, rounded outwards (``up`` for a max) so a
    nanosecond column's bound stays a bound."""
    raw = pa.scalar(value, t).cast(pa.int64()).as_py()
    per = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0}[t.unit]
    if per:
        return int(raw) * per
    return -((-int(raw)) // 1000) if up else int(raw) // 1000


def _bound(value: Any, t: pa.DataType, *, up: bool) -> StatValue | None:
    t = _value_type(t)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if pa.types.is_timestamp(t):
        return "TimestampMicrosWrapper", _micros(value, t, up=up)
    return wrap_stat_value(value, t)


def arrow_stats(table: pa.Table, columns: Iterable[str]) -> dict[str, ColumnStats]:
    """Stats of ``columns`` (those present) over the rows of ``table`` (a log file's
    records): ``min_max`` per column, sizes 0 as Hudi records for log files."""
    out: dict[str, ColumnStats] = {}
    for name in columns:
        if name not in table.column_names:
            continue
        column = table.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        lo = hi = None
        if column.null_count < len(column):
            mm = pc.min_max(column)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
        out[name] = ColumnStats(None, name, _bound(lo, column.type, up=False),
                                _bound(hi, column.type, up=True), len(column),
                                column.null_count, 0, 0)
    return out


def footer_stats(metadata: pq.FileMetaData, arrow_schema: pa.Schema,
                 columns: Iterable[str]) -> dict[str, ColumnStats]:
    """Stats of ``columns`` of a Parquet base file from its footer alone: row-group
    statistics merged (a row group without min/max leaves the bounds unknown: None with
    values present)."""
    wanted = [c for c in columns if c in arrow_schema.names]
    index = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    out: dict[str, ColumnStats] = {}
    for name in wanted:
        i = index.get(name)
        if i is None:
            continue
        t = arrow_schema.field(name).type
        lo = hi = None
        known = True
        values = nulls = size = raw = 0
        for rg in range(metadata.num_row_groups):
            chunk = metadata.row_group(rg).column(i)
            values += chunk.num_values
            size += chunk.total_compressed_size
            raw += chunk.total_uncompressed_size
            s = chunk.statistics
            if s is None:
                known = False
                continue
            nulls += s.null_count if s.has_null_count else 0
            if not s.has_null_count:
                known = False
            if s.has_min_max:
                lo = s.min if lo is None else min(lo, s.min)
                hi = s.max if hi is None else max(hi, s.max)
            elif chunk.num_values > (s.null_count if s.has_null_count else 0):
                known = False
        if not known:
            lo = hi = None
            nulls = 0
        out[name] = ColumnStats(None, name, _bound(lo, t, up=False), _bound(hi, t, up=True),
                                values, nulls, size, raw)
    return out


def base_file_stats(source: str | pa.NativeFile,
                    columns: Iterable[str]) -> dict[str, ColumnStats]:
    """Stats of a base file (a local path, or a file open through
    :meth:`~engine.storage.Storage.open_input`) from its footer."""
    with parquet_file(source) as f:  # a file open in parts: its footer alone is fetched
        return footer_stats(f.metadata, f.schema_arrow, columns)


def log_file_stats(storage: Storage, path: str, columns: Iterable[str],
                   schema: pa.Schema | None) -> dict[str, ColumnStats]:
    """Stats of a log file (path relative to the table) over its data blocks' records."""
    from engine.format.log_format import (
        BlockType,
        decode_avro_data_block,
        decode_parquet_data_block,
        iter_blocks,
    )

    tables = []
    for block in iter_blocks(storage.read(path)):
        if block.block_type is BlockType.PARQUET_DATA:
            tables.append(decode_parquet_data_block(block))
        elif block.block_type is BlockType.AVRO_DATA:
            tables.append(decode_avro_data_block(block, schema))
    columns = list(columns)
    if not tables:
        return {c: ColumnStats(None, c, None, None, 0, 0, 0, 0) for c in columns}
    return arrow_stats(pa.concat_tables(tables, promote_options="permissive"), columns)


def file_stats(storage: Storage, partition: str, name: str, columns: Iterable[str],
               schema: pa.Schema | None) -> dict[str, ColumnStats]:
    """Stats of one data file by name: a base file's footer, a log file's records."""
    path = f"{partition}/{name}" if partition else name
    if parse_base_file(name) is not None:
        with storage.open_input(path, whole=False) as source:
            return base_file_stats(source, columns)
    if parse_log_file(name) is not None:
        return log_file_stats(storage, path, columns, schema)
    return {}


# -- merging bounds (partition stats) ------------------------------------------

def merge_bounds(stats: Iterable[ColumnStats | None], column: str) -> ColumnStats:
    """The union of several files' stats of one column; a missing or unknown entry makes
    the union unknown (bounds None with values), as do bounds of different layouts (V1
    beside V2, or V2 of two value types: ``docs/table-version-9.md`` §5.2). Bounds are
    compared in their column's domain (:func:`~engine.metadata.records.pick_bound`)."""
    lo: StatValue | None = None
    hi: StatValue | None = None
    values = nulls = size = raw = 0
    bounded = True
    layouts: set[ValueTypeInfo | None] = set()
    for s in stats:
        if s is None or bounds_unknown(s):
            bounded = False
            values += max((s.value_count or 0) if s else 0, 1)
            continue
        if s.min_value is not None or s.max_value is not None:
            layouts.add(s.value_type)
        if len(layouts) > 1:
            bounded = False
        elif bounded:
            try:
                lo = pick_bound(lo, s.min_value, min, s.value_type)
                hi = pick_bound(hi, s.max_value, max, s.value_type)
            except (ValueError, TypeError):
                bounded = False
        values += s.value_count or 0
        nulls += s.null_count or 0
        size += s.total_size or 0
        raw += s.total_uncompressed_size or 0
    if not bounded:
        return ColumnStats(None, column, None, None, values, 0, size, raw)
    value_type = next(iter(layouts)) if layouts else None
    return ColumnStats(None, column, lo, hi, values, nulls, size, raw, value_type=value_type)


# -- the stats of a whole table ----------------------------------------------------------------

def table_columns(view: TableView, write_config: WriteConfig | None) -> tuple[str, ...]:
    """The columns indexed for the table ``view`` sees, with a writer's options."""
    schema = view.table_schema()
    if schema is None:
        return ()
    return configured_columns(schema, write_config, view.config.populate_meta_fields)


def _slice_files(slc: FileSlice) -> list[tuple[str, str]]:
    files = [(slc.partition_path, slc.base_file.name)] if slc.base_file is not None else []
    files += [(slc.partition_path, log.name) for log in slc.log_files]
    return files


def table_file_stats(view: TableView, write_config: WriteConfig | None
                     ) -> dict[tuple[str, str], dict[str, ColumnStats]]:
    """(partition, file name) → stats of the indexed columns, for every file of the latest
    slices ``view`` sees (read from the files: what building either partition starts from)."""
    columns = table_columns(view, write_config)
    schema = view.table_schema()
    out: dict[tuple[str, str], dict[str, ColumnStats]] = {}
    if not columns:
        return out
    for slc in view.latest_file_slices():
        for partition, name in _slice_files(slc):
            out[(partition, name)] = file_stats(view.storage, partition, name, columns, schema)
    return out
