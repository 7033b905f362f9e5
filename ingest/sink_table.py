"""The sink's table: opened or defined from its :class:`~ingest.sink_config.SinkConfig`, and
the checks made before any batch runs — of the table against the sink's index and fields, and
of the decoder's schema against the table (the engine's schema evolution rule) — plus the
decoder of tombstones' Kafka keys. Driver side; :mod:`ingest.sink` runs the batches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.errors import (
    InvalidOptionError,
    SchemaEvolutionError,
    TableExistsError,
    TableNotFoundError,
)
from engine.layout.incoming import check_field_types
from engine.schema import data_schema_of, evolve_schema, table_schema
from engine.table import Table
from engine.write.distributed import DELETE_MARKER, Timeline, WriteClient
from ingest.decode import Decoder
from ingest.prepare import check_ordering_type
from ingest.rows import RESERVED_PREFIXES
from ingest.sink_config import BUCKET, GLOBAL_STATE, RECORD_INDEX, SinkConfig

__all__ = ["KEY_FORMATS", "check_index", "check_reserved", "check_table_schema",
           "checked_data_schema", "evolved_schema", "key_decoder", "materialize", "open_or_define"]


def open_or_define(sink_config: SinkConfig, options: Mapping[str, Any] | None,
                   schema: pa.Schema) -> Table:
    """The sink's table: opened at ``sink_config.table_path`` and checked against its key,
    partition and ordering fields and index, or defined there (created on storage by the
    first batch with a valid record: :func:`materialize`) with ``schema``, the data columns
    the decoder stores. ``options``: the writer's table options. Driver side."""
    path, index = sink_config.table_path, sink_config.index
    record_key, precombine = sink_config.record_key, sink_config.precombine
    partition_by = sink_config.partition_by
    storage_options = dict(sink_config.storage_options or {})
    try:
        table = Table.open(path, storage_options=storage_options)
    except TableNotFoundError:
        table = None
    if table is None:
        if not record_key:
            raise ValueError(f"record_key: required to create the table at {path}")
        opts = ({"hoodie.index.type": RECORD_INDEX} if index == RECORD_INDEX else
                {"hoodie.index.type": "BUCKET",
                 "hoodie.bucket.index.num.buckets": str(sink_config.num_buckets)})
        opts |= dict(options or {})
        # Created on storage by the first batch with a valid record (materialize).
        defined = Table.define(path, name=sink_config.table_name or _default_name(path),
                               table_type=sink_config.table_type, record_key=record_key,
                               precombine=precombine, partition_by=partition_by,
                               options=opts, schema=schema,
                               storage_options=storage_options)
        check_index(defined, index)
        return defined
    table.check_writable()
    config = table.config
    for arg, wanted, actual in (("record_key", _fields(record_key), config.record_key_fields),
                                ("partition_by", _fields(partition_by),
                                 config.partition_fields),
                                ("precombine", _fields(precombine),
                                 _fields(config.precombine_field))):
        if wanted and wanted != actual:
            raise ValueError(f"{arg}: the table at {path} has {', '.join(actual) or 'none'}"
                             f", not {', '.join(wanted)}")
    if index == BUCKET and config.num_buckets is None:
        raise ValueError(f"index: the table at {path} was not created with the BUCKET "
                         "index (hoodie.index.type=BUCKET); use index=GLOBAL_STATE")
    if index == RECORD_INDEX:  # the table's index type is checked by Table.open
        options = {**(options or {}), "hoodie.index.type": RECORD_INDEX}
    if options:
        table = Table.open(path, options, storage_options=storage_options)
    check_index(table, index)
    return table

def check_index(table: Table, index: str) -> None:
    """Refuse a table the sink's ``index`` cannot write, naming the option."""
    if index == RECORD_INDEX:
        # The engine's own check: RECORD_INDEX needs the metadata table kept
        # (hoodie.metadata.enable), else InvalidOptionError naming the option.
        WriteClient(table.storage, table.config, table.write_config)
    if index == GLOBAL_STATE and table.config.consistent_hashing:
        raise InvalidOptionError(
            "hoodie.index.bucket.engine",
            f"the table at {table.path} uses CONSISTENT_HASHING, whose rings place every "
            "key; the GLOBAL_STATE index cannot write it (use index BUCKET)")

def check_reserved(decoded: pa.Schema) -> None:
    """Refuse decoder fields that use a prefix of tidelake's own columns."""
    for f in decoded:
        if f.name.startswith(RESERVED_PREFIXES) and f.name != "_hoodie_is_deleted":
            raise ValueError(f"decoder: field {f.name!r} uses a reserved prefix "
                             f"({', '.join(RESERVED_PREFIXES)})")

def checked_data_schema(table: Table, decoded: pa.Schema, full: pa.Schema) -> pa.Schema:
    """The table's data schema, which the decoder must produce (``decoded``: the decoder's
    fields the engine stores; ``full``: all of them, for tables that stored a
    ``_hoodie_is_deleted`` column)."""
    config = table.config
    timeline = Timeline.load(table.storage, config)
    recorded = table_schema(timeline)
    stores_marker = recorded is not None and DELETE_MARKER in recorded.names
    produced = full if stores_marker else decoded
    schema = evolved_schema(table, timeline, produced)
    # Checked on the decoder's own fields: a table column the decoder lacks is kept (as
    # nulls) with hoodie.write.set.null.for.missing.columns, but no key may be null.
    for name in (*config.record_key_fields, *config.partition_fields):
        if name not in produced.names:
            raise ValueError(f"decoder: the schema has no field {name!r} (a key or "
                             "partition field of the table)")
    # A key or partition type with no Java text would fail every batch: refuse it now.
    check_field_types(schema, (*config.record_key_fields, *config.partition_fields))
    if config.precombine_field:
        if config.precombine_field not in produced.names:
            raise ValueError(f"decoder: the schema has no ordering field "
                             f"{config.precombine_field!r}")
        check_ordering_type(config.precombine_field,
                            schema.field(config.precombine_field).type)
    return schema

def evolved_schema(table: Table, timeline: Timeline, decoded: pa.Schema) -> pa.Schema:
    """The table's data schema once the decoder's rows are written: the engine's rule
    (:func:`engine.schema.evolve_schema`: new fields added, types widened, anything else
    refused with :class:`~engine.errors.SchemaEvolutionError` naming the column)."""
    recorded = table_schema(timeline)
    return evolve_schema(
        data_schema_of(recorded) if recorded is not None else None, decoded,
        set_null_for_missing=table.write_config.set_null_for_missing_columns)

def check_table_schema(table: Table, timeline: Timeline, data_schema: pa.Schema) -> None:
    """Before a batch starts its instant: the table's schema must still evolve to the one
    this job writes; another writer that evolved it since fails the batch, naming the
    first column that differs (nothing is written; restart the job with a decoder of the
    table's schema)."""
    restart = ("the table's schema changed since this job started (another writer "
               "evolved it): restart the job with a decoder of the table's schema")
    try:
        now = evolved_schema(table, timeline, data_schema)
    except SchemaEvolutionError as exc:
        raise SchemaEvolutionError(exc.column, f"{exc}; {restart}") from None
    if now.equals(data_schema):
        return
    column = next((f.name for f in now if f.name not in data_schema.names
                   or not f.type.equals(data_schema.field(f.name).type)),
                  now.names[-1])
    raise SchemaEvolutionError(column, f"column {column!r}: {restart}")


def materialize(table: Table, storage_options: Mapping[str, Any]) -> None:
    """Create the defined table on storage; if another writer (a second job) created it
    first, go on with it when it is laid out as this sink's table would be."""
    try:
        table.materialize()
    except TableExistsError:
        existing = Table.open(table.path,
                              storage_options=storage_options).config
        ours = table.config
        layout = ("table_type", "record_key_fields", "partition_fields",
                  "precombine_field", "index_type", "num_buckets", "keygen_type")
        differs = [f for f in layout if getattr(existing, f) != getattr(ours, f)]
        if differs:
            raise ValueError(
                f"table_path: another writer created {table.path} meanwhile with "
                f"another {differs[0]} ({getattr(existing, differs[0])!r}, not "
                f"{getattr(ours, differs[0])!r})") from None


KEY_FORMATS = ("string", "json", "avro")


def key_decoder(key_format: str, key_schema: Any, config: Any,
                data_schema: pa.Schema) -> Decoder | None:
    """The decoder of tombstones' Kafka keys for ``key_format`` (None for ``"string"``)."""
    from ingest.decode import AvroDecoder, JsonDecoder

    if key_format not in KEY_FORMATS:
        raise ValueError(f"key_format: expected one of {', '.join(KEY_FORMATS)}, "
                         f"got {key_format!r}")
    if key_format == "string":
        if key_schema is not None:
            raise ValueError("key_schema: only used with key_format 'json' or 'avro'")
        return None
    if key_format == "avro":
        if key_schema is None:
            raise ValueError("key_schema: key_format 'avro' needs the key's Avro schema")
        return AvroDecoder(key_schema)
    if key_schema is None:
        names = [*config.record_key_fields, *config.partition_fields]
        key_schema = pa.schema([data_schema.field(n) for n in dict.fromkeys(names)])
    return JsonDecoder(key_schema)


def _fields(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(v).strip() for v in items if str(v).strip())


def _default_name(path: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", Path(path).name) or "table"
    return name if not name[0].isdigit() else f"t_{name}"
