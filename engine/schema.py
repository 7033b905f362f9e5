"""Table schemas: the five Hudi meta fields, and the data schema in Arrow and Avro forms."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine.errors import CorruptTableError
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
    schema_json, source = timeline.latest_schema_and_source()
    if not schema_json:
        return None
    try:
        return arrow_from_avro_json(schema_json)
    except (ValueError, TypeError, KeyError, AttributeError, pa.ArrowException) as exc:
        raise CorruptTableError(f"{source}: the table schema it records cannot be parsed: "
                                f"{type(exc).__name__}: {exc}") from exc


def normalize_input_schema(schema: pa.Schema) -> pa.Schema:
    """Storage types for user columns: large types narrowed, timestamps in microseconds."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_large_binary(t):
            t = pa.binary()
        elif pa.types.is_timestamp(t) and t.unit == "ns":
            t = pa.timestamp("us", tz=t.tz)
        elif pa.types.is_dictionary(t):
            t = t.value_type
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` as ``schema``: its columns in that order, cast to those types (dictionary
    columns decoded where the schema's type is plain), missing ones null; the result's schema
    is exactly ``schema``, metadata included, so a file's key-value metadata read with a table
    (a base file's bloom filter) never travels into the file it is rewritten to."""
    if table.schema.equals(schema, check_metadata=True):
        return table
    columns = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            columns.append(col if col.type.equals(f.type) else col.cast(f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)
