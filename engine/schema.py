"""Table schemas: the five Hudi meta fields, and the data schema in Arrow and Avro forms."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine.errors import CorruptTableError
from engine.format import timestamps
from engine.format.avro_schema import arrow_schema_to_avro, avro_schema_to_arrow

if TYPE_CHECKING:
    from engine.timeline.active import Timeline

COMMIT_TIME = "_hoodie_commit_time"
COMMIT_SEQNO = "_hoodie_commit_seqno"
RECORD_KEY = "_hoodie_record_key"
PARTITION_PATH = "_hoodie_partition_path"
FILE_NAME = "_hoodie_file_name"
META_FIELDS = (COMMIT_TIME, COMMIT_SEQNO, RECORD_KEY, PARTITION_PATH, FILE_NAME)
# Meta columns with few distinct values per file: read and written dictionary-encoded.
LOW_CARDINALITY_META = (COMMIT_TIME, PARTITION_PATH, FILE_NAME)
META_SCHEMA = pa.schema([pa.field(name, pa.string()) for name in META_FIELDS])


def record_name(table_name: str) -> tuple[str, str]:
    """Avro record name and namespace Spark-written Hudi tables use."""
    return f"{table_name}_record", f"hoodie.{table_name}"


def data_schema_of(table: pa.Schema) -> pa.Schema:
    """The schema without meta fields."""
    return pa.schema([f for f in table if f.name not in META_FIELDS])


def with_meta_fields(data: pa.Schema) -> pa.Schema:
    """Meta fields first, then the data fields."""
    return pa.schema(list(META_SCHEMA) + list(data_schema_of(data)))


def avro_data_schema(data: pa.Schema, table_name: str) -> dict[str, Any]:
    """Avro schema of the data fields (what ``extraMetadata.schema`` records)."""
    name, namespace = record_name(table_name)
    return arrow_schema_to_avro(data_schema_of(data), name, namespace)


def avro_full_schema(data: pa.Schema, table_name: str) -> dict[str, Any]:
    """Avro schema with the meta fields (what log blocks carry in their SCHEMA header)."""
    name, namespace = record_name(table_name)
    return arrow_schema_to_avro(with_meta_fields(data), name, namespace)


def arrow_from_avro_json(schema_json: str) -> pa.Schema:
    """Arrow schema (meta fields first) of an Avro schema JSON string."""
    return with_meta_fields(avro_schema_to_arrow(json.loads(schema_json)))


def table_schema(timeline: Timeline) -> pa.Schema | None:
    """The table's Arrow schema (meta fields first) from the latest commit that recorded one
    (else ``hoodie.table.create.schema``); None if none did. A recorded schema that cannot be
    parsed raises :class:`~engine.errors.CorruptTableError` naming its file."""
    return _recorded_schema(*timeline.latest_schema_and_source())


def _recorded_schema(schema_json: str | None, source: str) -> pa.Schema | None:
    if not schema_json:
        return None
    try:
        return arrow_from_avro_json(schema_json)
    except (ValueError, TypeError, KeyError, AttributeError, pa.ArrowException) as exc:
        raise CorruptTableError(f"{source}: the table schema it records cannot be parsed: "
                                f"{type(exc).__name__}: {exc}") from exc


def check_recorded_names(timeline: Timeline) -> None:
    """Refuse to write a table whose recorded schema (:func:`table_schema`) holds a column
    or struct field whose name is no Avro name (:func:`check_avro_name`), as another writer
    may have made it (tidelake did before it checked names): Hudi's writers cannot parse
    its schema and its readers refuse it (hudi-rs: ``Invalid field name``), so tidelake
    writes nothing more into it; reading it stays supported.
    :class:`~engine.errors.UnsupportedTableError` naming the column's path and the file that
    records the schema."""
    schema_json, source = timeline.latest_schema_and_source()
    schema = _recorded_schema(schema_json, source)
    if schema is None:
        return
    from engine.errors import SchemaEvolutionError, UnsupportedTableError

    try:
        check_avro_names(schema)
    except SchemaEvolutionError as exc:
        raise UnsupportedTableError(
            f"{source} records the table schema with column {exc.column!r}, whose name is "
            "not a valid Avro name (Avro names match [A-Za-z_][A-Za-z0-9_]*, nested struct "
            "fields too): Hudi's writers and readers refuse such a table (hudi-rs: Invalid "
            "field name), so tidelake does not write it; reading it is supported") from None


def normalize_input_schema(schema: pa.Schema) -> pa.Schema:
    """Storage types for user columns: large types narrowed, timestamps as
    :func:`engine.format.timestamps.storage_type` stores them (instants in UTC, zone-less
    values without a zone, ``ns`` as ``us``, ``s`` as ``ms``)."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_large_binary(t):
            t = pa.binary()
        elif pa.types.is_timestamp(t):
            t = timestamps.storage_type(t)
        elif pa.types.is_dictionary(t):
            t = t.value_type
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` as ``schema``: its columns in that order, cast to those types (dictionary
    columns decoded where the schema's type is plain, timestamps by :func:`cast_column`),
    missing ones null; the result's schema
    is exactly ``schema``, metadata included, so a file's key-value metadata read with a table
    (a base file's bloom filter) never travels into the file it is rewritten to."""
    if table.schema.equals(schema, check_metadata=True):
        return table
    if table.schema.equals(schema):  # the same columns, other metadata: only relabel
        return pa.Table.from_arrays(table.columns, schema=schema)
    columns = []
    for f in schema:
        if f.name in table.column_names:
            columns.append(cast_column(table.column(f.name), f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def cast_column(column: pa.ChunkedArray | pa.Array, target: pa.DataType
                ) -> pa.ChunkedArray | pa.Array:
    """``column`` as ``target``: timestamps of another unit or zone as
    :func:`engine.format.timestamps.cast_timestamps` casts them (floored, zone-less values
    taken as UTC), any other type by pyarrow's safe cast."""
    if column.type.equals(target):
        return column
    if timestamps.differs(column.type, target):
        return timestamps.cast_timestamps(column, target)
    return column.cast(target)


def _reads_as(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether a file's column of type ``have`` is cast to the table's ``want`` on read: a
    type the table widened since, or a timestamp of another unit or zone (a table written
    before :mod:`engine.format.timestamps` fixed one form per kind)."""
    return is_widening(have, want) or timestamps.differs(have, want)


# --- schema evolution on write (Hudi's rules: docs/engine.md, "Schema evolution") -----------

AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What an Avro name is (the Avro spec's ``[A-Za-z_][A-Za-z0-9_]*``): Hudi records the table
schema in Avro, and its Java writer and hudi-rs refuse a schema with any other field name
(hudi-rs: ``Failed to parse Avro schema: Invalid field name a.b``)."""


def check_avro_name(path: str, field: pa.Field) -> None:
    """Refuse a column or struct field (``field``, at ``path``: ``col``, ``col.field``,
    ``col.element.field``, ``col.value.field``) whose name, or the name of a struct field
    within it, is no Avro name (:data:`AVRO_NAME`): a table holding it could not be read by
    Hudi's readers. Raises :class:`~engine.errors.SchemaEvolutionError` naming the path."""
    if not AVRO_NAME.fullmatch(field.name):
        from engine.errors import SchemaEvolutionError

        raise SchemaEvolutionError(
            path, f"column {path!r}: {field.name!r} is not a valid Avro name (Avro names "
            "match [A-Za-z_][A-Za-z0-9_]*, nested struct fields too; Hudi's writers and "
            "readers refuse any other): rename it before it is written")
    _check_nested_names(path, field.type)


def check_avro_names(columns: Iterable[pa.Field]) -> None:
    """:func:`check_avro_name` of each of ``columns`` (top-level: a column's path is its
    name)."""
    for f in columns:
        check_avro_name(f.name, f)


def _check_nested_names(path: str, arrow_type: pa.DataType) -> None:
    if pa.types.is_struct(arrow_type):
        for f in arrow_type:
            check_avro_name(f"{path}.{f.name}", f)
    elif pa.types.is_map(arrow_type):
        _check_nested_names(f"{path}.value", arrow_type.item_type)
    elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        _check_nested_names(f"{path}.element", arrow_type.value_type)


_INT_BITS = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64,
             pa.uint8(): 9, pa.uint16(): 17, pa.uint32(): 33, pa.uint64(): 65}
"""Integer types by the signed width that holds all their values (storage is signed)."""

WIDENINGS = frozenset({(pa.int32(), pa.int64()), (pa.int32(), pa.float64()),
                       (pa.int64(), pa.float64()), (pa.float32(), pa.float64())})
"""(table type, input type) pairs a write widens a table column by: int → long,
int/long → double, float → double (the Avro promotions hudi-rs and Spark read back)."""


def is_widening(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether the table column type ``old`` may widen to ``new``: a pair of
    :data:`WIDENINGS`, or a nested type whose evolved form ``new`` holds every value of
    ``old`` (:func:`_nested_widening`) — what a reader casts a file's column by."""
    return (old, new) in WIDENINGS or _nested_widening(old, new)


def _nested(t: pa.DataType) -> bool:
    return (pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
            or pa.types.is_map(t))


def _nested_widening(old: pa.DataType, new: pa.DataType) -> bool:
    """``old`` and ``new`` are the same kind of nested type and differ, and ``new`` is
    ``old`` evolved (:func:`_evolve_type`): a struct with every field of ``old`` (by name) of
    the same or a widened type, maybe more fields; a list whose element, a map whose value
    (same keys) is so. A file's column of type ``old`` is read by casting it to ``new``
    (pyarrow matches struct fields by name and fills those it lacks with nulls)."""
    if not _nested(old) or old.equals(new):
        return False
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        names = {f.name for f in new}
        return all(f.name in names and (new.field(f.name).type.equals(f.type)
                                        or is_widening(f.type, new.field(f.name).type))
                   for f in old)
    if pa.types.is_map(old) and pa.types.is_map(new):
        return old.key_type.equals(new.key_type) and (
            old.item_type.equals(new.item_type) or is_widening(old.item_type, new.item_type))
    if ((pa.types.is_list(old) or pa.types.is_large_list(old))
            and (pa.types.is_list(new) or pa.types.is_large_list(new))):
        return old.value_type.equals(new.value_type) or is_widening(old.value_type,
                                                                    new.value_type)
    return False


def _evolve_type(path: str, table: pa.DataType, given: pa.DataType, *,
                 set_null_for_missing: bool) -> pa.DataType:
    """The table type at ``path`` (``col``, ``col.field``, ``col.element.field``,
    ``col.value.field``: Hudi's field paths) after a write of ``given``: the rule of
    :func:`evolve_schema`, recursed into structs, list elements and map values. A struct
    keeps its fields (one the input lacks: kept with ``set_null_for_missing``, else refused),
    each evolved, then takes the input's new ones, nullable, in the input's order; a leaf
    widens (:data:`WIDENINGS`) or keeps the table's type when it holds the input's
    (:func:`_promotes`); anything else is refused naming ``path``."""
    from engine.errors import SchemaEvolutionError

    if pa.types.is_null(given):
        return table
    if pa.types.is_struct(table) and pa.types.is_struct(given):
        names = {f.name for f in given}
        fields = []
        for f in table:
            sub = f"{path}.{f.name}"
            if f.name not in names:
                if not set_null_for_missing:
                    raise SchemaEvolutionError(
                        sub, f"field {sub!r}: the input lacks this field of the table schema: "
                        "a field is never dropped or renamed on write (set "
                        "hoodie.write.set.null.for.missing.columns=true to write nulls for it)")
                fields.append(f)
                continue
            evolved = _evolve_type(sub, f.type, given.field(f.name).type,
                                   set_null_for_missing=set_null_for_missing)
            fields.append(f if evolved.equals(f.type) else pa.field(f.name, evolved))
        have = {f.name for f in table}
        for f in given:
            if f.name not in have:
                check_avro_name(f"{path}.{f.name}", f)
        fields += [pa.field(f.name, f.type, nullable=True) for f in given if f.name not in have]
        return pa.struct(fields)
    if pa.types.is_map(table) and pa.types.is_map(given):
        _evolve_type(f"{path}.key", table.key_type, given.key_type,
                     set_null_for_missing=set_null_for_missing)
        value = _evolve_type(f"{path}.value", table.item_type, given.item_type,
                             set_null_for_missing=set_null_for_missing)
        return table if value.equals(table.item_type) else pa.map_(
            table.key_field, table.item_field.with_type(value))
    if ((pa.types.is_list(table) or pa.types.is_large_list(table))
            and (pa.types.is_list(given) or pa.types.is_large_list(given))):
        element = _evolve_type(f"{path}.element", table.value_type, given.value_type,
                               set_null_for_missing=set_null_for_missing)
        return table if element.equals(table.value_type) else pa.list_(
            table.value_field.with_type(element))
    if not (_nested(table) or _nested(given)):
        if (table, given) in WIDENINGS:
            return given
        if _promotes(given, table):
            return table
    raise SchemaEvolutionError(
        path, f"field {path!r}: input type {given} cannot be written to the table's {table} "
        "(the table's types only widen on write: int to long, int or long to double, float "
        "to double; a struct, list element or map value only gains nullable fields)")


def _promotes(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether input of type ``src`` is stored in a table column of type ``dst`` as it is
    (cast, the table type unchanged): Hudi's canonicalization of the incoming schema
    (``AvroSchemaEvolutionUtils.reconcileSchemaRequirements`` with
    ``SchemaChangeUtils.isTypeUpdateAllow``), plus Arrow's forms of one Avro type (narrow
    integers, timestamp units, dictionaries)."""
    if src.equals(dst) or pa.types.is_null(src):
        return True
    if pa.types.is_dictionary(src):
        return _promotes(src.value_type, dst)
    if pa.types.is_integer(src):
        if pa.types.is_integer(dst):
            return _INT_BITS[src] <= _INT_BITS[dst]
        return (pa.types.is_floating(dst) or pa.types.is_decimal(dst)
                or pa.types.is_string(dst) or pa.types.is_large_string(dst))
    if pa.types.is_floating(src):
        return ((pa.types.is_floating(dst) and src.bit_width <= dst.bit_width)
                or pa.types.is_decimal(dst) or pa.types.is_string(dst))
    if pa.types.is_decimal(src):
        return pa.types.is_decimal(dst) or pa.types.is_string(dst)
    if pa.types.is_string(src) or pa.types.is_large_string(src):
        return (pa.types.is_string(dst) or pa.types.is_date(dst) or pa.types.is_decimal(dst)
                or pa.types.is_binary(dst))
    if pa.types.is_date(src) or pa.types.is_binary(src) or pa.types.is_large_binary(src):
        return pa.types.is_string(dst) or pa.types.is_binary(dst)
    if pa.types.is_timestamp(src):
        return pa.types.is_timestamp(dst)
    return False


def evolve_schema(table: pa.Schema | None, incoming: pa.Schema, *,
                  set_null_for_missing: bool = False) -> pa.Schema:
    """The table's data schema after a write of ``incoming`` columns (both without meta
    fields): Hudi's schema evolution on write (``HoodieSchemaUtils.deduceWriterSchema``
    without reconciliation, its default).

    - a column new to the table is added, nullable, after the table's columns (in the
      input's order); old files read null for it;
    - a column whose input type is a widening of the table's (:data:`WIDENINGS`) takes
      the input's type; old files read their values widened;
    - a column whose input type the table's type holds (an int for a long column, a long
      for a double one: Hudi's canonicalization) keeps the table's type;
    - a table column the input lacks: written as nulls with ``set_null_for_missing``
      (``hoodie.write.set.null.for.missing.columns``), else refused — as is any other type
      change (narrowing, or another type): :class:`~engine.errors.SchemaEvolutionError`
      naming the column;
    - a struct column, a list's element struct, a map's value struct: the same rules, field
      by field (:func:`_evolve_type`; a refusal names the field's path, ``col.field``,
      ``col.element.field``, ``col.value.field``, as Hudi's ``findAnyMissingFields``).

    ``table`` None (a table without a recorded schema) takes the input's storage types.
    """
    incoming = normalize_input_schema(incoming)
    check_avro_names(f for f in incoming if table is None or f.name not in table.names)
    if table is None:
        return incoming
    fields = []
    for f in table:
        if f.name not in incoming.names:
            if not set_null_for_missing:
                from engine.errors import SchemaEvolutionError

                raise SchemaEvolutionError(
                    f.name, f"input lacks column {f.name!r} of the table schema: a column "
                    "is never dropped or renamed on write (set "
                    "hoodie.write.set.null.for.missing.columns=true to write nulls for it)")
            fields.append(f)
            continue
        given = incoming.field(f.name).type
        if _nested(f.type) or _nested(given):
            evolved = _evolve_type(f.name, f.type, given,
                                   set_null_for_missing=set_null_for_missing)
            fields.append(f if evolved.equals(f.type) else pa.field(f.name, evolved))
        elif is_widening(f.type, given):
            fields.append(pa.field(f.name, given, nullable=True))
        elif _promotes(given, f.type):
            fields.append(f)
        else:
            from engine.errors import SchemaEvolutionError

            raise SchemaEvolutionError(
                f.name, f"column {f.name!r}: input type {given} cannot be written to the "
                f"table's {f.type} (the table's types only widen on write: int to long, "
                "int or long to double, float to double)")
    fields += [f for f in incoming if f.name not in table.names]
    return pa.schema(fields)


def evolve_columns(data: pa.Table, schema: pa.Schema | None) -> pa.Table:
    """Rows a file wrote under an older table schema, as ``schema`` has them now: columns
    of ``schema`` the file lacks come back null, columns the table widened since are cast,
    timestamps of another unit or zone too (:func:`cast_column`: an older table may hold
    zone-less files beside files of instants);
    every other column stays as read (dictionary-encoded meta columns too), columns of the
    file that ``schema`` lacks stay after them. None leaves ``data`` as it is."""
    if schema is None or data.schema.equals(schema):
        return data
    names = data.column_names
    if all(f.name in names and not _reads_as(data.schema.field(f.name).type, f.type)
           for f in schema):
        return data
    columns: list[pa.ChunkedArray | pa.Array] = []
    fields = []
    for f in schema:
        if f.name not in names:
            columns.append(pa.nulls(data.num_rows, f.type))
            fields.append(pa.field(f.name, f.type, nullable=True))
            continue
        have = data.schema.field(f.name)
        if _reads_as(have.type, f.type):
            columns.append(cast_column(data.column(f.name), f.type))
            fields.append(pa.field(f.name, f.type, nullable=True))
        else:
            columns.append(data.column(f.name))
            fields.append(have)
    for name in names:
        if name not in schema.names:
            columns.append(data.column(name))
            fields.append(data.schema.field(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=data.schema.metadata))


def commit_schema(latest_json: str | None, own_json: str | None, table_name: str) -> str:
    """The schema a commit records (``extraMetadata.schema``), under the table lock right
    before its commit point: its own, joined with the table's schema as it is now
    (``latest_json``) when another writer evolved it since this one started — so a writer
    that started before an evolution and completes after it never takes the table's schema
    back (readers take the latest completed commit's). Its files read null for the columns
    they lack and widened values, as any file of an older schema."""
    if not latest_json or not own_json or latest_json == own_json:
        return own_json or latest_json or ""
    latest = data_schema_of(arrow_from_avro_json(latest_json))
    own = data_schema_of(arrow_from_avro_json(own_json))
    joined = evolve_schema(latest, own, set_null_for_missing=True)
    if joined.equals(own):
        return own_json
    if joined.equals(latest):
        return latest_json
    return json.dumps(avro_data_schema(joined, table_name), separators=(",", ":"))
