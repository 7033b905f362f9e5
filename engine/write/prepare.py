"""A batch made ready to tag: validated, conformed to the table's schema, keyed and combined.

The first step of a write (:meth:`engine.write.write_client.WriteClient.prepare`): before
anything is written, input that cannot be stored is refused
(:class:`~engine.errors.InvalidRecordError` naming the column), the schema evolves by Hudi's
rules, every record gets its key and partition path, in-batch duplicates combine (Hudi's
``HoodieWriteHelper.deduplicateRecords``) and rows marked ``_hoodie_is_deleted`` become
deletes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import TableConfig, WriteConfig
from engine.errors import InvalidRecordError
from engine.layout.keygen import key_batch, partition_paths, record_keys
from engine.merge.record_merger import dedupe_batch
from engine.schema import (
    PARTITION_PATH,
    RECORD_KEY,
    arrow_from_avro_json,
    cast_column,
    data_schema_of,
    evolve_schema,
)
from engine.timeline.active import Timeline

DELETE_MARKER = "_hoodie_is_deleted"
"""Hudi's delete marker column: a row whose value is true deletes its key."""
_MARKED = "__tidelake_marked_deleted"


def table_data_schema(timeline: Timeline) -> pa.Schema | None:
    """The table's data schema (data columns only) as of ``timeline``, None before any."""
    schema_json = timeline.latest_schema()
    if not schema_json:
        return None
    return data_schema_of(arrow_from_avro_json(schema_json))


def conform_input(data: pa.Table, schema: pa.Schema | None,
                  write_config: WriteConfig) -> pa.Table:
    """The input as the table stores it after this write: its schema evolved by Hudi's
    rules (:func:`~engine.schema.evolve_schema`: new columns added, types widened,
    missing columns null with ``hoodie.write.set.null.for.missing.columns``, anything
    else refused naming the column), every column cast to its stored type.

    ``_hoodie_*`` columns are dropped unless the table's schema has them (a table
    written by Java may store ``_hoodie_is_deleted``).
    """
    meta_cols = [c for c in data.column_names if c.startswith("_hoodie_")
                 and (schema is None or c not in schema.names)]
    if meta_cols:
        data = data.drop_columns(meta_cols)
    target = evolve_schema(schema, data.schema,
                           set_null_for_missing=write_config.set_null_for_missing_columns)
    return cast_to(data, target)


def prepare_records(data: pa.Table, timeline: Timeline, config: TableConfig,
                    write_config: WriteConfig, *,
                    dedupe: bool) -> tuple[pa.Table, pa.Table | None]:
    """Validate, compute keys/partition paths, and combine duplicates in the batch.

    Returns ``(records, deletes)``. Rows whose ``_hoodie_is_deleted`` is true are
    deletes, as Hudi treats them: they take part in the in-batch combine like any row
    (so a marker delete carries its row's ordering value and wins or loses by the merge
    mode), and the winners come back in ``deletes`` (key, partition path and ordering
    value, the shape :func:`prepare_deletes` returns); ``deletes`` is None without any.
    In-batch duplicates combine on (key, partition path) with a non-global index and on
    the key alone with a global one, as Hudi's ``HoodieWriteHelper.deduplicateRecords``.
    """
    if not isinstance(data, pa.Table):
        raise TypeError(f"data: expected a pyarrow.Table, got {type(data).__name__}")
    schema = table_data_schema(timeline)
    marker = _delete_marker(data)
    data = conform_input(data, schema, write_config)
    keyed = key_batch(data, config)
    records = data.append_column(RECORD_KEY, keyed.record_keys).append_column(
        PARTITION_PATH, keyed.partition_paths)
    if marker is not None:
        records = records.append_column(_MARKED, marker)
    if dedupe and write_config.combine_before_upsert:
        global_index = write_config.index_type.is_global
        records = dedupe_batch(records, mode=config.merge_mode,
                               ordering_field=config.precombine_field,
                               partition_column=None if global_index else PARTITION_PATH)
    if marker is None:
        return records, None
    marked = records.column(_MARKED)
    doomed = records.filter(marked)
    records = records.filter(pc.invert(marked)).drop_columns([_MARKED])
    if not doomed.num_rows:
        return records, None
    columns = [RECORD_KEY, PARTITION_PATH]
    ordering = config.precombine_field
    if ordering and ordering in doomed.column_names:
        columns.append(ordering)
    return records, doomed.select(columns)


def prepare_deletes(data: pa.Table, timeline: Timeline, config: TableConfig) -> pa.Table:
    """Keys (and partition paths / ordering values when given) of records to delete."""
    if not isinstance(data, pa.Table):
        raise TypeError(f"data: expected a pyarrow.Table, got {type(data).__name__}")
    schema = table_data_schema(timeline)
    data = _key_columns_as_stored(data, schema, config)
    keys = record_keys(data, config)
    columns = {RECORD_KEY: keys}
    have_partitions = all(f in data.column_names for f in config.partition_fields)
    if config.partition_fields and have_partitions:
        columns[PARTITION_PATH] = partition_paths(data, config)
    elif not config.partition_fields:
        columns[PARTITION_PATH] = pa.array([""] * len(keys), pa.string())
    ordering = config.precombine_field
    if ordering and ordering in data.column_names:
        col = data.column(ordering).combine_chunks()
        if schema is not None and ordering in schema.names:
            try:
                col = cast_column(col, schema.field(ordering).type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise InvalidRecordError(
                    f"ordering column {ordering!r} of type {col.type} cannot be stored as "
                    f"{schema.field(ordering).type}") from None
        columns[ordering] = col
    table = pa.table(columns)
    # One delete per key (per key and partition when partitions are given): the last.
    return _last_per_key(table)


def records_as_of(timeline: Timeline, records: pa.Table | None,
                  write_config: WriteConfig) -> tuple[pa.Table | None, pa.Schema]:
    """Prepared ``records`` (None for none) in the schema as of the instant's start
    (``timeline``), and that data schema: another writer may have evolved it since the
    records were prepared (checked again, still before any file)."""
    data_schema = table_data_schema(timeline)
    if records is not None:
        given = records.drop_columns([RECORD_KEY, PARTITION_PATH])
        data_schema = evolve_schema(
            data_schema, given.schema,
            set_null_for_missing=write_config.set_null_for_missing_columns)
        if not given.schema.equals(data_schema):
            records = cast_to(given, data_schema).append_column(
                RECORD_KEY, records.column(RECORD_KEY)).append_column(
                PARTITION_PATH, records.column(PARTITION_PATH))
    return records, data_schema if data_schema is not None else pa.schema([])


def _delete_marker(data: pa.Table) -> pa.Array | None:
    """The rows whose ``_hoodie_is_deleted`` is true (None without such a column)."""
    if DELETE_MARKER not in data.column_names:
        return None
    column = data.column(DELETE_MARKER).combine_chunks()
    try:
        flags = column.cast(pa.bool_())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise InvalidRecordError(
            f"column {DELETE_MARKER!r} of type {column.type} is not a boolean") from None
    return pc.fill_null(flags, False)


def _last_per_key(table: pa.Table) -> pa.Table:
    n = table.num_rows
    if n < 2:
        return table
    idx = pa.array(np.arange(n))
    t = table.append_column("_i", idx)
    group = [RECORD_KEY] + ([PARTITION_PATH] if PARTITION_PATH in table.column_names else [])
    last = t.group_by(group, use_threads=False).aggregate([("_i", "max")]).column("_i_max")
    return table.take(pa.array(np.sort(last.to_numpy())))


def _key_columns_as_stored(data: pa.Table, schema: pa.Schema | None,
                           config: TableConfig) -> pa.Table:
    """Key and partition columns cast to the table's types, so they format as stored ones
    (a delete given ``2`` for a double key means the stored ``2.0``)."""
    if schema is None:
        return data
    for name in (*config.record_key_fields, *config.partition_fields):
        if name not in data.column_names or name not in schema.names:
            continue
        column, wanted = data.column(name), schema.field(name).type
        if column.type.equals(wanted):
            continue
        try:
            cast = cast_column(column, wanted)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InvalidRecordError(
                f"column {name!r} of type {column.type} cannot be stored as {wanted}") from None
        data = data.set_column(data.column_names.index(name), pa.field(name, wanted), cast)
    return data


def cast_to(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` with exactly ``schema``'s columns (those it lacks null), each cast to its
    type; a value that does not fit raises :class:`~engine.errors.InvalidRecordError`."""
    columns = []
    for f in schema:
        if f.name not in data.column_names:
            columns.append(pa.nulls(data.num_rows, f.type))
            continue
        col = data.column(f.name)
        if not col.type.equals(f.type):
            try:
                col = cast_column(col, f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidRecordError(
                    f"column {f.name!r} of type {col.type} cannot be stored as "
                    f"{f.type}: {exc}") from None
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)
