"""Key generation: record keys, partition paths and ordering values for a batch of rows.

Record keys follow Hudi's key generators (docs/engine.md, "Record keys and the index type"): SIMPLE
uses the value of the one key field; COMPLEX joins ``field:value`` pairs with commas (also for one
key field: Hudi 1.x's default ``hoodie.write.complex.keygen.new.encoding=false`` for table
version 8); NON_PARTITION puts every record in the ``""`` partition. Hudi's custom key
generator with ``SIMPLE`` parts only writes what these write, and is read as one of them
(``engine.config``: SIMPLE for one key field, else COMPLEX; docs/engine.md). Work is vectorized
with pyarrow compute; partition paths are encoded once per distinct value combination.

A value becomes text exactly as Java's key generators make it — ``KeyGenUtils.getRecordKey``
/ ``getRecordPartitionPath`` call ``HoodieAvroUtils.getNestedFieldValAsString``, which is
``String.valueOf`` of the Avro value after ``convertValueForAvroLogicalTypes`` (with
``hoodie.datasource.write.keygenerator.consistent.logical.timestamp.enabled`` at its default,
false). :func:`field_strings` is that rule, and the only one: the writer (here and in
``ingest/``), the key-filter pruning of the reader and the bucket index all use it, so a Java
writer computes the same keys, partition paths and bucket ids for the same values:

=================================  ============================================================
column type                        text
=================================  ============================================================
string                             the value
boolean                            ``true`` / ``false``
integers                           decimal digits (``Integer``/``Long.toString``)
float64 / float32                  ``Double.toString`` / ``Float.toString``: shortest digits,
                                   ``2.0``, ``1.0E7``, ``1.0E-4``, ``NaN``, ``Infinity``
decimal                            ``BigDecimal.toString`` (``1.50``, ``1E-7``, ``0E-7``)
date                               ``LocalDate.toString``: ``2024-01-05``
timestamp (s, ms)                  epoch **milliseconds** (Avro ``timestamp-millis`` is a long)
timestamp (us, ns)                 epoch **microseconds** (Avro ``timestamp-micros``)
time32 / time64                    milliseconds / microseconds since midnight
=================================  ============================================================

Other types (binary, nested, ...) have no text a Java writer would reproduce (``ByteBuffer``
and ``GenericRecord`` ``toString``) and are refused with
:class:`~engine.errors.InvalidRecordError` naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.config import KeyGeneratorType, TableConfig
from engine.errors import InvalidRecordError
from engine.layout.partition import partition_path


@dataclass(frozen=True)
class KeyedBatch:
    """A batch with its record keys and partition paths computed (same row order)."""

    data: pa.Table
    record_keys: pa.Array  # string
    partition_paths: pa.Array  # string


def field_strings(column: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    """Java's text of every value of one key or partition field (nulls stay null).

    Raises :class:`InvalidRecordError` naming ``name`` for a type without such a text.
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = arr.type
    if pa.types.is_dictionary(t):
        return field_strings(arr.cast(t.value_type), name)
    if pa.types.is_string(t):
        return arr
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return arr.cast(pa.string())
    if pa.types.is_boolean(t):
        return pc.if_else(arr, "true", "false")
    if pa.types.is_date64(t):
        return pc.cast(arr.cast(pa.date32()), pa.string())
    if pa.types.is_integer(t) or pa.types.is_date32(t):
        return pc.cast(arr, pa.string())
    if pa.types.is_timestamp(t):
        unit = "ms" if t.unit in ("s", "ms") else "us"
        return pc.cast(arr.cast(pa.timestamp(unit, tz=t.tz)).cast(pa.int64()), pa.string())
    if pa.types.is_time32(t):
        return pc.cast(arr.cast(pa.time32("ms")).cast(pa.int32()), pa.string())
    if pa.types.is_time64(t):
        return pc.cast(arr.cast(pa.time64("us")).cast(pa.int64()), pa.string())
    if pa.types.is_floating(t):
        single = not pa.types.is_float64(t)
        values = arr.cast(pa.float32() if single else pa.float64()).to_numpy(
            zero_copy_only=False)
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        return pa.array([java_float_string(v, single=single) if ok else None
                         for v, ok in zip(values, valid, strict=True)], pa.string())
    if pa.types.is_decimal(t):
        return pa.array([None if v is None else str(v) for v in arr.to_pylist()], pa.string())
    raise InvalidRecordError(
        f"field {name!r} has type {t}; Hudi's key generators have no stable text for it "
        "(use a string, integer, boolean, decimal, floating point, date or timestamp column)")


def parse_field_string(text: str | None, arrow_type: pa.DataType) -> pa.Array:
    """One value of ``arrow_type`` from its :func:`field_strings` text (a partition folder's
    value read back); raises ``ValueError``/``ArrowInvalid`` for text it cannot be."""
    if text is None:
        return pa.nulls(1, arrow_type)
    if pa.types.is_timestamp(arrow_type):
        unit = "ms" if arrow_type.unit in ("s", "ms") else "us"
        stored = pa.array([int(text)], pa.int64()).cast(pa.timestamp(unit, tz=arrow_type.tz))
        return stored.cast(arrow_type)
    if pa.types.is_time32(arrow_type):
        return pa.array([int(text)], pa.int32()).cast(pa.time32("ms")).cast(arrow_type)
    if pa.types.is_time64(arrow_type):
        return pa.array([int(text)], pa.int64()).cast(pa.time64("us")).cast(arrow_type)
    return pa.array([text], pa.string()).cast(arrow_type)


def check_field_types(schema: pa.Schema, fields: Sequence[str]) -> None:
    """Refuse, before anything is written, key or partition fields of ``schema`` whose type
    has no Java text (:class:`InvalidRecordError` naming the field); absent fields pass."""
    for name in fields:
        if name in schema.names:
            field_strings(pa.nulls(0, schema.field(name).type), name)


def java_float_string(value: float | np.floating[Any], *, single: bool = False) -> str:
    """Java's ``Double.toString`` (``Float.toString`` with ``single``) of ``value``.

    The shortest digits that read back as the same value (what Java 19+ prints, and older
    Java for all but rare values), laid out as Java does: plain notation from 10^-3 up to
    10^7, else ``d.dddE<n>``; always at least one digit after the point.
    """
    v = float(value)
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    if v == 0:
        return "-0.0" if np.signbit(v) else "0.0"
    text = str(np.float32(v)) if single else repr(v)
    if len(Decimal(text).as_tuple().digits) == 1:
        # Java prints two digits at least, and then picks the two-digit decimal nearest
        # the exact binary value (Double.MIN_VALUE is 4.9E-324, not 5.0E-324).
        two = f"{v:.1e}"
        if (np.float32(two) == np.float32(v)) if single else (float(two) == v):
            text = two
    sign, digit_tuple, exponent = Decimal(text).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    sci = len(digits) - 1 + exponent  # value = d.ddd * 10**sci
    digits = digits.rstrip("0") or "0"
    prefix = "-" if sign else ""
    if -3 <= sci < 7:
        if sci >= 0:
            whole = digits[:sci + 1].ljust(sci + 1, "0")
            fraction = digits[sci + 1:] or "0"
        else:
            whole, fraction = "0", "0" * (-sci - 1) + digits
        return f"{prefix}{whole}.{fraction}"
    return f"{prefix}{digits[0]}.{digits[1:] or '0'}E{sci}"


def record_keys(table: pa.Table, config: TableConfig) -> pa.Array:
    """Record key strings for every row; rejects null or empty key values."""
    fields = config.record_key_fields
    missing = [f for f in fields if f not in table.column_names]
    if missing:
        raise InvalidRecordError(f"input has no record key column {missing[0]!r}")
    parts = []
    for name in fields:
        arr = field_strings(table.column(name), name)
        # (the sum of an all-null column is null: every row is then bad already)
        bad = arr.null_count + (pc.sum(pc.equal(pc.utf8_length(arr), 0)).as_py() or 0) \
            if len(arr) else 0
        if bad:
            raise InvalidRecordError(
                f"{bad} row(s) have a null or empty record key field '{name}'")
        parts.append(arr)
    if config.keygen_type is KeyGeneratorType.COMPLEX or len(fields) > 1:
        pieces: list[pa.Array | str] = []
        for name, arr in zip(fields, parts, strict=True):
            pieces.append(pc.binary_join_element_wise(f"{name}:", arr, ""))
        joined = pc.binary_join_element_wise(*pieces, ",")
        return joined
    return parts[0]


def partition_paths(table: pa.Table, config: TableConfig) -> pa.Array:
    """Encoded partition path per row (``""`` for non-partitioned tables)."""
    fields = config.partition_fields
    n = table.num_rows
    if not fields or config.keygen_type is KeyGeneratorType.NON_PARTITION:
        return pa.array([""] * n, pa.string()) if n else pa.array([], pa.string())
    missing = [f for f in fields if f not in table.column_names]
    if missing:
        raise InvalidRecordError(f"input has no partition column {missing[0]!r}")
    columns = [field_strings(table.column(f), f) for f in fields]
    if len(columns) == 1:
        encoded = columns[0].dictionary_encode()
        dictionary = encoded.dictionary.to_pylist()
        paths = [partition_path(fields, [v], hive_style=config.hive_style,
                                url_encode=config.url_encode)
                 for v in dictionary]
        null_path = partition_path(fields, [None], hive_style=config.hive_style,
                                url_encode=config.url_encode)
        indices = encoded.indices
        out = pc.take(pa.array(paths, pa.string()), indices)
        if out.null_count:
            out = pc.fill_null(out, null_path)
        return out
    combos = pa.StructArray.from_arrays(columns, names=list(fields))
    rows = combos.to_pylist()
    cache: dict[tuple[str | None, ...], str] = {}
    result = []
    for row in rows:
        key = tuple(row[f] for f in fields)
        path = cache.get(key)
        if path is None:
            path = partition_path(fields, list(key), hive_style=config.hive_style,
                                url_encode=config.url_encode)
            cache[key] = path
        result.append(path)
    return pa.array(result, pa.string())


def check_ordering(table: pa.Table, config: TableConfig) -> None:
    """Reject input whose ordering (precombine) field is missing or null."""
    field = config.precombine_field
    if not field:
        return
    if field not in table.column_names:
        raise InvalidRecordError(f"input has no ordering field column {field!r}")
    nulls = table.column(field).null_count
    if nulls:
        raise InvalidRecordError(f"{nulls} row(s) have a null ordering field '{field}'")


def key_batch(table: pa.Table, config: TableConfig) -> KeyedBatch:
    """Compute keys and partition paths, validating the input first (nothing written yet)."""
    keys = record_keys(table, config)
    check_ordering(table, config)
    paths = partition_paths(table, config)
    return KeyedBatch(table, keys, paths)
