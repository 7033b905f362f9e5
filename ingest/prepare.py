"""Kafka rows → keyed rows: decode, record keys, partition paths, ordering values, operation.

This is the first step of every micro-batch, and it runs in executor tasks (``mapInArrow``).
Each Kafka row becomes exactly one *prepared* row carrying its operation:

* ``UPSERT`` — the value decoded, and it has a record key, an ordering value (when the table
  has a precombine field) and a partition value that can be stored;
* ``DELETE`` — a Kafka tombstone (null value, non-null key: the record key comes from the
  Kafka key as :attr:`PrepareSpec.kafka_key` says), or a decoded row whose delete-marker column
  (default ``_hoodie_is_deleted``) is true. A tombstone carries no ordering value: it deletes
  the key's live version at that version's ordering value (:mod:`ingest.resolve`); a marker
  delete carries its row's ordering value;
* ``ERROR`` — anything else, with a short reason for the error table: the value did not
  decode, the record key or ordering value is missing, the partition value cannot be stored,
  or a tombstone's Kafka key cannot be mapped to a record key.

Bad records are data here, never exceptions: one bad record never fails a batch. A decoder
that fails for another reason (:class:`~ingest.decode.DecoderError`: a bug, not bad data)
fails the batch, naming the Kafka record (topic, partition, offset) it failed on.

The columns of prepared rows, and their packing for a shuffle, are :mod:`ingest.rows`'s:
the decoded data columns, then keys, ordering and Kafka coordinates (the raw value only for
error rows). Every index path carries them whole and decodes each value once; the
global-state index's rows cross its state operator packed as Arrow IPC, which pandas never
converts.

Everything here is a pure function of its input and a picklable :class:`PrepareSpec`, so a
replayed batch prepares to exactly the same rows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import TableConfig
from engine.errors import InvalidOptionError, InvalidRecordError, TidelakeError
from engine.layout.incoming import key_buckets, partition_paths, record_keys, ring_nodes
from engine.merge.resolve import ordering_column, ordering_column_type
from engine.schema import PARTITION_PATH, RECORD_KEY
from engine.storage import Storage
from ingest.ddl import spark_schema
from ingest.decode import (
    Decoder,
    DecoderError,
    arrow_schema_from_text,
    arrow_schema_to_text,
    decoder_from_spec,
)
from ingest.rows import (
    BUCKET,
    DELETE,
    ERROR,
    FILE_ID,
    KAFKA_COLUMNS,
    KAFKA_KEY,
    KAFKA_PARTITION,
    OFFSET,
    OP,
    ORDERING,
    ORDERING_NULL,
    PACK_BYTES,
    PACK_ROWS,
    REASON,
    RING,
    SUPERSEDED,
    TIMESTAMP,
    TOPIC,
    UPSERT,
    VALUE,
    pack_by_shard,
    pack_rows,
    packed_schema,
    shard_packed_schema,
)
from ingest.supersede import superseded_keys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "PrepareSpec",
    "check_ordering_type",
    "output_schema",
    "prepare_batch",
    "prepare_frame",
    "prepare_stream",
    "prepared_schema",
    "spec_from_json",
    "spec_to_json",
]

_UTC_US = pa.timestamp("us", tz="UTC")
_Rows = TypeVar("_Rows", pa.Array, pa.Table)
_ORDERING_TYPES = "integer, floating point, string, boolean, decimal, date or timestamp"


@dataclass(frozen=True)
class PrepareSpec:
    """How to turn Kafka rows into prepared rows; built on the driver, pickled to tasks (or
    sent as plain data through the source option ``tidelake.prepare``: :func:`spec_to_json`;
    fields other than the decoder, config and schema must be JSON scalars).

    ``data_schema`` is the table's data schema (storage types): the decoder's fields, less
    ``_hoodie_*`` ones (the engine never stores those; ``_hoodie_is_deleted`` is read as the
    delete marker only). ``tombstone_partition`` says where a tombstone's partition comes from:
    ``"none"`` (non-partitioned table: ``""``), ``"state"`` (the global-state index fills it
    in: left null here), ``"bucket"`` (bucket index on a partitioned table: left null; the
    write tasks deliver the tombstone to the key's bucket in every partition, see
    :func:`ingest.spark_write.place_rows`) or ``"unknown"`` (the tombstone is an error; so
    on a partitioned consistent-hashing table, whose rings are per partition).
    """

    decoder: Decoder
    config: TableConfig
    data_schema: pa.Schema
    delete_column: str | None = "_hoodie_is_deleted"
    tombstone_partition: str = "unknown"
    num_buckets: int | None = None
    """Buckets per partition when the BUCKET index places rows: prepare then fills
    :data:`BUCKET`, the key's bucket, so that rows can be shuffled by file group at once."""
    key_decoder: Decoder | None = None
    """How a tombstone's Kafka key becomes its record key: None — the key as UTF-8 is the
    record key string; a decoder (JSON or Avro) — the key holds the record key fields (and
    maybe the partition fields), formatted by the engine's key generator. Keys that cannot be
    mapped make the tombstone an error row with the reason."""
    pack: bool = False
    """Emit packed rows (:func:`pack_rows`): one row per file group and task, for the shuffle.
    Needs ``num_buckets`` or ``state_shards``."""
    state_shards: int | None = None
    """GLOBAL_STATE index: with ``pack``, rows are packed by the shard of their key (one row
    per shard and task, :data:`SHARD`) for the state operator, instead of by file group."""
    ring_table: Storage | None = None
    """The storage of a consistent-hashing table (with ``num_buckets``, its initial count):
    :data:`BUCKET` is then the index of the key's node in its partition's committed ring
    (read from the table), and :data:`RING` that ring's instant, which the write tasks check
    against the ring of their instant's snapshot."""

    @property
    def ordering_type(self) -> pa.DataType | None:
        """Arrow type of the ordering (precombine) field, or None without one."""
        field = self.config.precombine_field
        return self.data_schema.field(field).type if field else None

    @property
    def ordering_column_type(self) -> pa.DataType | None:
        """Arrow type of :data:`ORDERING`: the ordering field's, except timestamps (UTC
        microseconds) and dates (days) as int64, so that no conversion on the way (pandas in
        the state operator, Spark's session time zone) can shift them."""
        t = self.ordering_type
        return None if t is None else ordering_column_type(t)

    @property
    def event_time(self) -> bool:
        """True when versions are ordered by the ordering field (else by arrival)."""
        return self.config.orders_by_event_time


_SPEC_VERSION = 1
_SPEC_SPECIAL = ("decoder", "config", "data_schema", "key_decoder")


def spec_to_json(spec: PrepareSpec) -> str:
    """``spec`` as plain data (JSON): the decoder's kind, schema and options
    (``decoder.to_spec()``), the table config's ``hoodie.properties`` map, the data schema as
    a serialized Arrow schema, and the flags. Raises ``ValueError`` for a decoder that has
    no plain-data form (only :class:`~ingest.decode.JsonDecoder` and
    :class:`~ingest.decode.AvroDecoder` have one)."""
    config = spec.config
    body: dict[str, Any] = {
        "version": _SPEC_VERSION,
        "decoder": _decoder_spec(spec.decoder),
        "config": {"properties": dict(config.raw) if config.raw else config.to_properties(),
                   "from_file": bool(config.raw)},
        "data_schema": arrow_schema_to_text(spec.data_schema),
        "key_decoder": _decoder_spec(spec.key_decoder) if spec.key_decoder else None,
    }
    for f in dataclasses.fields(spec):
        if f.name not in _SPEC_SPECIAL:
            body[f.name] = getattr(spec, f.name)
    if spec.ring_table is not None:
        # The location only: this text is a Spark option, shown in query plans, so storage
        # options (credentials) never go in; executors find the store through their
        # environment, as Spark's own sources do.
        body["ring_table"] = spec.ring_table.base_path
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def spec_from_json(text: str, option: str = "tidelake.prepare") -> PrepareSpec:
    """The :class:`PrepareSpec` of :func:`spec_to_json`'s text; anything else raises
    :class:`~engine.errors.InvalidOptionError` naming ``option`` and what is wrong. Parses
    JSON only: no value is ever unpickled or evaluated."""
    def bad(what: str) -> InvalidOptionError:
        return InvalidOptionError(option, f"is not a prepare spec of spec_to_json(): {what}")

    try:
        body = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise bad("expected a JSON object")
    if body.get("version") != _SPEC_VERSION:
        raise bad(f"version {body.get('version')!r}, expected {_SPEC_VERSION}")
    known = {f.name: f for f in dataclasses.fields(PrepareSpec)}
    unknown = sorted(set(body) - set(known) - {"version"})
    if unknown:
        raise bad(f"unknown field(s) {unknown}")
    missing = sorted(name for name in _SPEC_SPECIAL[:3] if name not in body)
    if missing:
        raise bad(f"missing field(s) {missing}")
    try:
        decoder = decoder_from_spec(body["decoder"])
    except ValueError as exc:
        raise bad(str(exc)) from None
    key_decoder = None
    if body.get("key_decoder") is not None:
        try:
            key_decoder = decoder_from_spec(body["key_decoder"])
        except ValueError as exc:
            raise bad(f"key_decoder: {exc}") from None
    raw = body["config"]
    if not (isinstance(raw, dict) and isinstance(raw.get("properties"), dict)
            and all(isinstance(k, str) and isinstance(v, str)
                    for k, v in raw["properties"].items())):
        raise bad("config.properties: expected an object of strings")
    try:
        config = TableConfig.from_properties(raw["properties"])
    except (TidelakeError, ValueError) as exc:
        raise bad(f"config.properties: {exc}") from None
    if not raw.get("from_file"):
        config = dataclasses.replace(config, raw={})
    try:
        data_schema = arrow_schema_from_text(body["data_schema"])
    except (ValueError, TypeError) as exc:
        raise bad(f"data_schema: {exc}") from None
    flags: dict[str, Any] = {}
    for name, value in body.items():
        if name in _SPEC_SPECIAL or name == "version":
            continue
        if name == "ring_table" and value is not None:
            if not isinstance(value, str) or not value:
                raise bad(f"ring_table: {value!r} is not a table location")
            flags[name] = Storage(value)
            continue
        annotation = str(known[name].type)
        allowed = {"str": str, "int": int, "bool": bool, "None": type(None)}
        if not any(token in annotation and type(value) is kind
                   for token, kind in allowed.items()):
            raise bad(f"{name}: {value!r} is not of type {annotation}")
        flags[name] = value
    return PrepareSpec(decoder=decoder, config=config, data_schema=data_schema,
                       key_decoder=key_decoder, **flags)


def _decoder_spec(decoder: Decoder) -> Any:
    to_spec = getattr(decoder, "to_spec", None)
    if to_spec is None:
        raise ValueError(f"decoder: {type(decoder).__name__} cannot be described as "
                         "plain data (only JsonDecoder and AvroDecoder can)")
    return to_spec()


def check_ordering_type(field: str, arrow_type: pa.DataType) -> None:
    """Raise ValueError unless ``arrow_type`` can serve as an ordering (precombine) value."""
    t = arrow_type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t)
            or pa.types.is_boolean(t) or pa.types.is_decimal(t) or pa.types.is_date(t)
            or pa.types.is_timestamp(t)):
        raise ValueError(f"precombine: field {field!r} has type {t}; an ordering field must be "
                         f"{_ORDERING_TYPES}")


def meta_fields(spec: PrepareSpec) -> list[pa.Field]:
    """The bookkeeping columns every prepared row has, after the data columns (if any)."""
    fields = [
        pa.field(RECORD_KEY, pa.string()),
        pa.field(PARTITION_PATH, pa.string()),
        pa.field(OP, pa.int8()),
        pa.field(REASON, pa.string()),
        pa.field(TOPIC, pa.string()),
        pa.field(KAFKA_PARTITION, pa.int32()),
        pa.field(OFFSET, pa.int64()),
        pa.field(TIMESTAMP, _UTC_US),
        pa.field(KAFKA_KEY, pa.binary()),
        pa.field(VALUE, pa.binary()),
        pa.field(FILE_ID, pa.string()),
        pa.field(SUPERSEDED, pa.string()),
    ]
    ordering = spec.ordering_column_type
    if ordering is not None:
        fields += [pa.field(ORDERING, ordering), pa.field(ORDERING_NULL, pa.bool_())]
    if spec.num_buckets is not None:
        fields.append(pa.field(BUCKET, pa.int32()))
        if spec.ring_table is not None:
            fields.append(pa.field(RING, pa.string()))
    return fields


def prepared_schema(spec: PrepareSpec) -> pa.Schema:
    """Arrow schema of prepared rows: the data columns, then the bookkeeping ones."""
    data = [f.with_nullable(True) for f in spec.data_schema]
    return pa.schema(data + meta_fields(spec))


def _column(batch: pa.Table, name: str, arrow_type: pa.DataType) -> pa.Array:
    n = batch.num_rows
    if name not in batch.column_names:
        return pa.nulls(n, arrow_type)
    col = batch.column(name).combine_chunks()
    return col if col.type.equals(arrow_type) else col.cast(arrow_type)


def _scatter(values: pa.Array, positions: np.ndarray, n: int) -> pa.Array:
    """An array of length ``n``: ``values[i]`` at ``positions[i]``, null elsewhere.

    ``positions`` ascend without repeats (a subset of ``range(n)``), so ``n`` of them are every
    row in order: ``values`` itself, no copy (the common batch, where every record decoded)."""
    if len(positions) == n:
        return values
    inverse = np.full(n, -1, dtype=np.int64)
    inverse[positions] = np.arange(len(positions), dtype=np.int64)
    indices = pa.array(inverse, mask=inverse < 0)
    return values.take(indices)


def _bad_keys(data: pa.Table, config: TableConfig) -> list[str | None]:
    """Per row: why its record key is unusable (None if it is fine)."""
    n = data.num_rows
    reasons: list[str | None] = [None] * n
    for name in reversed(config.record_key_fields):  # the first bad field is reported
        col = data.column(name).combine_chunks()
        missing = pc.is_null(col)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            missing = pc.or_(missing, pc.fill_null(pc.equal(pc.utf8_length(col), 0), False))
        for i in np.flatnonzero(missing.to_numpy(zero_copy_only=False)):
            reasons[int(i)] = f"record key field '{name}' is null or empty"
    return reasons


def _partitions(data: pa.Table, config: TableConfig) -> tuple[pa.Array, dict[int, str]]:
    """Partition path per row, and the reason for each row whose value cannot be stored."""
    try:
        return partition_paths(data, config), {}
    except InvalidRecordError:
        pass
    # Rare path: find the offending values one distinct combination at a time.
    fields = list(config.partition_fields)
    rows = data.select(fields)
    paths: list[str | None] = [None] * data.num_rows
    bad: dict[int, str] = {}
    known: dict[tuple[object, ...], str | Exception] = {}
    for i, row in enumerate(rows.to_pylist()):
        combo = tuple(row[f] for f in fields)
        found = known.get(combo)
        if found is None:
            try:
                found = str(partition_paths(rows.slice(i, 1), config)[0].as_py())
            except InvalidRecordError as exc:
                found = exc
            known[combo] = found
        if isinstance(found, Exception):
            bad[i] = str(found)
        else:
            paths[i] = found
    return pa.array(paths, pa.string()), bad


def _take(rows: _Rows, positions: np.ndarray) -> _Rows:
    """``rows`` at ``positions`` (ascending, without repeats): ``rows`` itself when they are
    every row, else a copy of those rows."""
    if len(positions) == len(rows):
        return rows
    return rows.take(pa.array(positions, pa.int64()))


def _where(coordinates: pa.Table, rows: np.ndarray) -> str:
    """Kafka coordinates of ``rows`` of a batch: ``record topic-partition offset o``, or the
    first and last of several. ``coordinates`` has topic, partition and offset columns."""
    if not len(rows) or coordinates.num_columns != 3:
        return "records without Kafka coordinates"
    picked = [tuple(r.values()) for r in
              coordinates.take(pa.array([rows[0], rows[-1]], pa.int64())).to_pylist()]
    (topic, part, offset), last = picked[0], picked[-1]
    if len(rows) == 1:
        return f"record {topic}-{part} offset {offset}"
    return (f"records {topic}-{part} offset {offset} to {last[0]}-{last[1]} offset {last[2]}")


def _data_rows(spec: PrepareSpec, values: pa.Array, op: np.ndarray,
               reasons: list[str | None], coordinates: pa.Table) -> pa.Table:
    """Decode the non-null values into full-length data columns (nulls where not decoded).

    ``coordinates``: topic, partition and offset of each value, to name the record a
    :class:`~ingest.decode.DecoderError` concerns."""
    n = len(values)
    present = np.flatnonzero(~values.is_null().to_numpy(zero_copy_only=False))
    try:
        result = spec.decoder.decode(_take(values, present))
    except Exception as exc:
        known = [i for i in exc.rows if 0 <= i < len(present)] \
            if isinstance(exc, DecoderError) else []
        rows = present[known] if known else present
        raise DecoderError(f"decoding {_where(coordinates, rows)} failed (not a bad record, "
                           f"so it is not sent to the error table): {exc}") from exc
    for index, reason in result.errors:
        row = int(present[index])
        op[row] = ERROR
        reasons[row] = f"cannot decode the value: {reason}"
    good = present[np.asarray(result.good_index, dtype=np.int64)]
    fields = [f.with_nullable(True) for f in spec.data_schema]
    marker = spec.delete_column
    if marker and marker not in spec.data_schema.names:  # e.g. _hoodie_is_deleted: not stored
        fields.append(pa.field(marker, pa.bool_()))
    columns = []
    for f in fields:
        col = _column(result.table, f.name, f.type) if len(good) else pa.array([], f.type)
        columns.append(_scatter(col, good, n))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def prepare_batch(batch: pa.RecordBatch | pa.Table, spec: PrepareSpec) -> pa.Table:
    """Prepared rows of one batch of Kafka rows (same order). Executor side; never raises
    on bad records."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    n = table.num_rows
    values = _column(table, "value", pa.binary())
    kafka_keys = _column(table, "key", pa.binary())
    op = np.full(n, UPSERT, dtype=np.int8)
    reasons: list[str | None] = [None] * n
    data = _data_rows(spec, values, op, reasons,
                      table.select([c for c in ("topic", "partition", "offset")
                                    if c in table.column_names]))
    config = spec.config
    tombstone = values.is_null().to_numpy(zero_copy_only=False)

    # Deletes: tombstones, and decoded rows whose marker column is true.
    if spec.delete_column and spec.delete_column in data.column_names:
        marked = pc.fill_null(data.column(spec.delete_column).combine_chunks().cast(pa.bool_()),
                              False).to_numpy(zero_copy_only=False)
        op[marked & (op == UPSERT)] = DELETE
    op[tombstone] = DELETE

    # Records whose value decoded: keys, ordering values, partition paths.
    decoded = np.flatnonzero((op != ERROR) & ~tombstone)
    rows = _take(data, decoded)
    for i, reason in enumerate(_bad_keys(rows, config)):
        if reason:
            op[decoded[i]], reasons[decoded[i]] = ERROR, reason
    ordering_field = config.precombine_field
    if ordering_field:
        nulls = rows.column(ordering_field).is_null().to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(nulls).tolist():
            row = int(decoded[i])
            if op[row] != ERROR:
                op[row], reasons[row] = ERROR, f"ordering field '{ordering_field}' is null"
    keep = op[decoded] != ERROR
    decoded, rows = decoded[keep], rows.filter(pa.array(keep))
    paths, bad_paths = _partitions(rows, config)
    for i, reason in bad_paths.items():
        op[decoded[i]], reasons[decoded[i]] = ERROR, reason
    keyed = np.ones(len(decoded), dtype=bool)
    keyed[list(bad_paths)] = False
    keys = record_keys(rows.filter(pa.array(keyed)), config) if keyed.any() else \
        pa.array([], pa.string())
    key_col = _scatter(keys, decoded[keyed], n)
    path_col = _scatter(paths.filter(pa.array(keyed)), decoded[keyed], n)

    # Tombstones: the record key comes from the Kafka key; the partition is known sometimes.
    if tombstone.any():
        key_list = key_col.to_pylist()
        path_list = path_col.to_pylist()
        raw_keys = kafka_keys.to_pylist()
        rows_t = [row for row in np.flatnonzero(tombstone).tolist()
                  if not _no_key(raw_keys[row], row, op, reasons)]
        for row, key, path, reason in _tombstone_keys(spec, [raw_keys[r] for r in rows_t],
                                                      rows_t):
            if reason is not None:
                op[row], reasons[row] = ERROR, reason
                continue
            key_list[row] = key
            if path is not None:
                path_list[row] = path
            elif spec.tombstone_partition == "none":
                path_list[row] = ""
            elif spec.tombstone_partition == "unknown":
                op[row], reasons[row] = ERROR, (
                    "tombstone on a partitioned table: its partition is unknown to the BUCKET "
                    "index (put the partition fields in a json or avro Kafka key, or use the "
                    "GLOBAL_STATE index)")
            # "bucket" / "state": left null, for the write tasks / the state index.
        key_col = pa.array(key_list, pa.string())
        path_col = pa.array(path_list, pa.string())

    rings = None
    if spec.num_buckets is None:
        buckets = None
    elif spec.ring_table is None:
        buckets = _buckets(key_col, op, spec.num_buckets)
    else:
        buckets, rings = _ring_nodes(key_col, path_col, op, spec.ring_table, spec.num_buckets)
    error = op == ERROR
    columns: dict[str, pa.Array] = {
        f.name: data.column(f.name).combine_chunks() for f in spec.data_schema}
    null_str = pa.nulls(n, pa.string())
    error_mask = pa.array(error)
    columns.update({
        RECORD_KEY: _unless(error, key_col),
        PARTITION_PATH: _unless(error, path_col),
        OP: pa.array(op, pa.int8()),
        REASON: pa.array(reasons, pa.string()),
        TOPIC: _column(table, "topic", pa.string()),
        KAFKA_PARTITION: _column(table, "partition", pa.int32()),
        OFFSET: _column(table, "offset", pa.int64()),
        TIMESTAMP: _column(table, "timestamp", _UTC_US),
        KAFKA_KEY: _unless(~error, kafka_keys),
        VALUE: _unless(~error, values),
        FILE_ID: null_str,
    })
    columns[SUPERSEDED] = superseded_keys(
        pa.table([columns[TOPIC], columns[KAFKA_PARTITION], columns[OFFSET]],
                 names=[TOPIC, KAFKA_PARTITION, OFFSET]), data, spec.config, op == ERROR,
        (op == UPSERT) | (op == DELETE), key_col, kafka_keys,
        lambda raw, rows: _tombstone_keys(spec, raw, rows))
    ordering_type = spec.ordering_type
    if ordering_field and ordering_type is not None:
        ordering = ordering_column(data.column(ordering_field).combine_chunks(), ordering_type)
        is_null = pc.or_(pc.is_null(ordering), error_mask)
        columns[ORDERING] = pc.if_else(is_null, _zero(ordering.type), ordering)
        columns[ORDERING_NULL] = is_null
    if buckets is not None:
        columns[BUCKET] = buckets
    if rings is not None:
        columns[RING] = rings
    return pa.table(columns, schema=prepared_schema(spec))


def _unless(mask: np.ndarray, values: pa.Array) -> pa.Array:
    """``values`` with nulls where ``mask`` is true: no copy when it is true nowhere (a batch
    without errors keeps every key) or everywhere (no raw value kept: all nulls)."""
    if not mask.any():
        return values
    if mask.all():
        return pa.nulls(len(values), values.type)
    return pc.if_else(pa.array(mask), pa.nulls(len(values), values.type), values)


def _no_key(raw: bytes | None, row: int, op: np.ndarray, reasons: list[str | None]) -> bool:
    """Mark a null value without a Kafka key as an error (it is not a tombstone)."""
    if raw is None:
        op[row], reasons[row] = ERROR, "null value without a key (not a tombstone)"
        return True
    if not raw:
        op[row], reasons[row] = ERROR, "tombstone with an empty key"
        return True
    return False


def _tombstone_keys(spec: PrepareSpec, raw: list[bytes], rows: list[int]
                    ) -> list[tuple[int, str | None, str | None, str | None]]:
    """(row, record key, partition path or None, error reason or None) of each tombstone.

    Without a key decoder the Kafka key, as UTF-8, is the record key string; on a table with
    several key fields it must then be the engine's formatting of them (checked by formatting
    the ``field:value`` pairs it holds again). With a key decoder (JSON or Avro) the Kafka key
    holds the record key fields — and, when it holds every partition field, the partition —
    and the engine's key generator formats them.
    """
    config = spec.config
    fields = config.record_key_fields
    out: list[tuple[int, str | None, str | None, str | None]] = []
    if spec.key_decoder is None:
        for row, value in zip(rows, raw, strict=True):
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                out.append((row, None, None, "tombstone key is not UTF-8"))
                continue
            if len(fields) > 1 and not _is_formatted_key(text, config):
                out.append((row, None, None, (
                    f"tombstone key {text[:80]!r} is not a record key of this table (fields "
                    f"{', '.join(fields)}); send the formatted key, or set the Kafka key "
                    "format to json or avro")))
                continue
            out.append((row, text, None, None))
        return out
    result = spec.key_decoder.decode(pa.array(raw, pa.binary()))
    for index, reason in result.errors:
        out.append((rows[index], None, None, f"tombstone key does not decode: {reason}"))
    table = result.table
    good = [rows[int(i)] for i in result.good_index]
    missing = [f for f in fields if f not in table.column_names]
    if missing:
        out += [(row, None, None, f"tombstone key has no record key field '{missing[0]}'")
                for row in good]
        return sorted(out)
    bad = _bad_keys(table, config)
    ok = np.array([reason is None for reason in bad], dtype=bool)
    out += [(row, None, None, f"tombstone key: {reason}")
            for row, reason in zip(good, bad, strict=True) if reason is not None]
    keyed = table.filter(pa.array(ok))
    keys = record_keys(keyed, config).to_pylist() if keyed.num_rows else []
    paths: list[str | None] = [None] * len(keys)
    parts = list(config.partition_fields)
    if parts and keyed.num_rows and all(p in keyed.column_names for p in parts):
        complete = np.ones(keyed.num_rows, dtype=bool)
        for name in parts:
            complete &= ~keyed.column(name).is_null().to_numpy(zero_copy_only=False)
        if complete.any():
            found, _ = _partitions(keyed.filter(pa.array(complete)), config)
            for i, path in zip(np.flatnonzero(complete).tolist(), found.to_pylist(),
                               strict=True):
                paths[i] = path
    rows_ok = [row for row, fine in zip(good, ok.tolist(), strict=True) if fine]
    out += [(row, key, path, None) for row, key, path in zip(rows_ok, keys, paths, strict=True)]
    return sorted(out, key=lambda item: item[0])


def _is_formatted_key(text: str, config: TableConfig) -> bool:
    """True if ``text`` is what the key generator makes of the ``field:value`` pairs in it."""
    pairs: dict[str, str] = {}
    for piece in text.split(","):
        name, sep, value = piece.partition(":")
        if not sep or name in pairs:
            return False
        pairs[name] = value
    if set(pairs) != set(config.record_key_fields):
        return False
    try:
        again = record_keys(pa.table({k: [v] for k, v in pairs.items()}), config)
    except InvalidRecordError:
        return False
    return bool(again[0].as_py() == text)


def _buckets(keys: pa.Array, op: np.ndarray, num_buckets: int) -> pa.Array:
    """The bucket of every keyed row's record key (null for errors)."""
    keyed = np.flatnonzero(op != ERROR)
    return _scatter(key_buckets(_take(keys, keyed), num_buckets), keyed,
                    len(keys))


def _ring_nodes(keys: pa.Array, paths: pa.Array, op: np.ndarray, storage: Storage,
                num_buckets: int) -> tuple[pa.Array, pa.Array]:
    """Consistent hashing: the index of every keyed row's node in its partition's committed
    ring, and that ring's instant (:func:`engine.layout.incoming.ring_nodes`; nulls for
    errors)."""
    keyed = np.flatnonzero(op != ERROR)
    where = pa.array(keyed, pa.int64())
    nodes, instants = ring_nodes(keys.take(where), paths.take(where), storage, num_buckets)
    return _scatter(nodes, keyed, len(keys)), _scatter(instants, keyed, len(keys))


def _zero(arrow_type: pa.DataType) -> pa.Scalar:
    """A non-null placeholder of ``arrow_type`` for rows without an ordering value.

    Placeholders keep the column free of nulls, so pandas (in the state operator) keeps its
    exact type; :data:`ORDERING_NULL` says which values are real.
    """
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return pa.scalar("", arrow_type)
    if pa.types.is_boolean(arrow_type):
        return pa.scalar(False)
    if pa.types.is_decimal(arrow_type):
        return pa.array([0]).cast(arrow_type)[0]
    return pa.array([0], pa.int64()).cast(arrow_type)[0]


def output_schema(spec: PrepareSpec) -> pa.Schema:
    """Schema of what :func:`prepare_stream` yields for ``spec``."""
    if not spec.pack:
        return prepared_schema(spec)
    return shard_packed_schema() if spec.state_shards else packed_schema()


def prepare_stream(batches: Iterator[pa.RecordBatch], spec: PrepareSpec
                   ) -> Iterator[pa.RecordBatch]:
    """Prepared rows of a stream of Kafka row batches — packed when ``spec.pack``, a
    :data:`PACK_ROWS` (or :data:`PACK_BYTES`) at a time. Executor side (a read task or a
    ``mapInArrow`` task)."""
    if not spec.pack:
        for batch in batches:
            if batch.num_rows:
                yield from prepare_batch(batch, spec).to_batches()
        return
    pending: list[pa.Table] = []
    count = size = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        prepared = prepare_batch(batch, spec)
        pending.append(prepared)
        count += batch.num_rows
        size += prepared.nbytes
        if count >= PACK_ROWS or size >= PACK_BYTES:
            yield from _pack(pa.concat_tables(pending), spec).to_batches()
            pending, count, size = [], 0, 0
    if pending:
        yield from _pack(pa.concat_tables(pending), spec).to_batches()


def _pack(prepared: pa.Table, spec: PrepareSpec) -> pa.Table:
    if spec.state_shards:
        return pack_by_shard(prepared, spec.state_shards)
    return pack_rows(prepared)


def prepare_frame(df: DataFrame, spec: PrepareSpec) -> DataFrame:
    """Prepared rows of a DataFrame of Kafka rows (``mapInArrow``: runs in executor tasks),
    packed when ``spec.pack``."""
    missing = [c for c in KAFKA_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"source rows lack Kafka column(s) {missing}; expected the columns of "
                         f"Spark's Kafka source: {', '.join(KAFKA_COLUMNS)}")
    return df.select(*KAFKA_COLUMNS).mapInArrow(lambda batches: prepare_stream(batches, spec),
                                                spark_schema(output_schema(spec)))

