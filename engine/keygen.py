"""Key generation: record keys, partition paths and ordering values for a batch of rows.

Record keys follow Hudi's key generators (``hudi-format.md`` §1.4): SIMPLE uses the value
of the one key field; COMPLEX joins ``field:value`` pairs with commas; NON_PARTITION puts
every record in the ``""`` partition. Work is vectorized with pyarrow compute; partition
paths are encoded once per distinct value combination.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from engine.config import KeyGeneratorType, TableConfig
from engine.errors import InvalidRecordError
from engine.partition import partition_path


@dataclass(frozen=True)
class KeyedBatch:
    """A batch with its record keys and partition paths computed (same row order)."""

    data: pa.Table
    record_keys: pa.Array  # string
    partition_paths: pa.Array  # string


def _as_string(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_string(arr.type):
        return arr
    if pa.types.is_large_string(arr.type):
        return arr.cast(pa.string())
    if pa.types.is_timestamp(arr.type) or pa.types.is_date(arr.type):
        return pc.cast(arr, pa.string())
    if pa.types.is_boolean(arr.type):
        return pc.if_else(arr, "true", "false")
    return pc.cast(arr, pa.string())


def record_keys(table: pa.Table, config: TableConfig) -> pa.Array:
    """Record key strings for every row; rejects null or empty key values."""
    fields = config.record_key_fields
    missing = [f for f in fields if f not in table.column_names]
    if missing:
        raise InvalidRecordError(f"input has no record key column {missing[0]!r}")
    parts = []
    for name in fields:
        arr = _as_string(table.column(name))
        bad = arr.null_count + pc.sum(pc.equal(pc.utf8_length(arr), 0)).as_py() \
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
    columns = [_as_string(table.column(f)) for f in fields]
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
