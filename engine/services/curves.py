"""Sort orders for clustering: linear, z-order and hilbert (docs/engine.md, "Clustering").

Hudi's ``SpaceCurveSortingHelper`` (``direct`` build method) maps every sort column of a row
to a fixed-width value, combines the values of one row into a curve key, and sorts rows by
that key compared as unsigned bytes. This module reproduces the mapping of each Arrow type
(Java ``BinaryUtil`` for z-order, ``HilbertCurveUtils`` for hilbert) with numpy over whole columns —
clustering sorts millions of rows — and keeps the keys as rows of big-endian ``uint64`` words, whose
lexicographic order is the byte order of Hudi's keys. :func:`zorder_key_bytes` and
:func:`hilbert_key_bytes` give the keys as Hudi writes them, for tests.

Rules shared by both curves:

* one sort column: no curve, an ascending sort (Java range-partitions by the column);
* the dimension order is not the order of ``sort.columns``: Java collects the columns in a
  ``HashMap`` keyed by their position in the row schema (meta fields included), so they
  come by bucket (position mod table capacity), ties in insertion order
  (:func:`dimension_order`);
* linear: an ascending multi-column sort in the declared order, nulls first (Spark).
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

LINEAR = "linear"
ZORDER = "z-order"
HILBERT = "hilbert"

_SIGN64 = np.uint64(1 << 63)
_LOW63 = np.uint64((1 << 63) - 1)
_INT_MAX = 0x7FFFFFFF
_SHORT_MAX = 0x7FFF
_LONG_MAX = (1 << 63) - 1
_DOUBLE_MAX = float(np.finfo(np.float64).max)
_FLOAT_MAX = float(np.finfo(np.float32).max)
HILBERT_BITS = 63
HILBERT_KEY_BYTES = 63


def normalize_strategy(name: str) -> str:
    """``linear``, ``z-order`` (also ``zorder``) or ``hilbert``, case-insensitive."""
    value = name.strip().lower()
    if value in ("zorder", "z-order", "z_order"):
        return ZORDER
    if value in (LINEAR, HILBERT):
        return value
    raise ValueError(f"layout strategy: expected linear, z-order or hilbert, got {name!r}")


def dimension_order(schema_names: Sequence[str], columns: Sequence[str]) -> list[str]:
    """The order in which Java's curve sort takes the columns.

    Java keys a ``HashMap<Integer, StructField>`` by each column's position in the row
    schema and iterates it: by bucket ``position & (capacity - 1)`` (capacity 16, doubled
    while more than 0.75 x capacity entries), entries of one bucket in insertion order.
    """
    positions = []
    for name in columns:
        if name not in schema_names:
            raise ValueError(f"sort column {name!r} is not a column of the table "
                             f"({', '.join(schema_names)})")
        positions.append(list(schema_names).index(name))
    capacity = 16
    while len(positions) > capacity * 0.75:
        capacity *= 2
    order = sorted(range(len(columns)), key=lambda i: (positions[i] & (capacity - 1), i))
    return [columns[i] for i in order]


# -- per-type values ------------------------------------------------------------------------


def _as_numpy(arr: pa.Array, fill: object, dtype: type) -> np.ndarray:
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(fill, arr.type))
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _epoch_millis(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(epoch milliseconds as int64, null mask) of a date or timestamp column."""
    nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_date32(arr.type):
        days = _as_numpy(arr.cast(pa.int32()), 0, np.int64)
        return days * 86_400_000, nulls
    if pa.types.is_date64(arr.type):
        return _as_numpy(arr.cast(pa.int64()), 0, np.int64), nulls
    unit = arr.type.unit
    raw = _as_numpy(arr.cast(pa.int64()), 0, np.int64)
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
    if per_ms is None:
        return raw * 1000, nulls
    return np.floor_divide(raw, per_ms), nulls


def _prefix8(arr: pa.Array) -> np.ndarray:
    """First 8 bytes of each value as a big-endian number, shorter values right-aligned
    (left-padded with zeros); nulls and empty values give 0."""
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
    elif pa.types.is_fixed_size_binary(arr.type):
        arr = arr.cast(pa.binary())
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(b"", arr.type))
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    offset_type = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[arr.offset:arr.offset + n + 1]
    data = (np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
            else np.zeros(0, np.uint8))
    starts = offsets[:-1].astype(np.int64)
    lengths = np.minimum(offsets[1:].astype(np.int64) - starts, 8)
    out = np.zeros(n, np.uint64)
    padded = np.concatenate([data, np.zeros(8, np.uint8)])
    for j in range(8):
        take = j < lengths
        byte = padded[np.where(take, starts + j, len(padded) - 1)].astype(np.uint64)
        out = np.where(take, (out << np.uint64(8)) | byte, out)
    return out


def _flip_double(values: np.ndarray) -> np.ndarray:
    """Z-order bytes of doubles: positive → top bit flipped, negative → every bit inverted,
    0.0, -0.0 and NaN unchanged (Hudi's ``BinaryUtil.toBytes(double)``)."""
    bits = values.astype(np.float64).view(np.uint64).copy()
    positive = values > 0
    negative = values < 0
    bits[positive] ^= _SIGN64
    bits[negative] = ~bits[negative]
    return bits


def _decimal_long(arr: pa.Array, fill: int) -> np.ndarray:
    """``BigDecimal.longValue()``: the integer part, truncated toward zero, wrapped to 64
    bits."""
    out = np.empty(len(arr), np.int64)
    for i, value in enumerate(arr.to_pylist()):
        if value is None:
            out[i] = fill
            continue
        whole = int(value.to_integral_value(rounding=decimal.ROUND_DOWN))
        out[i] = ((whole + (1 << 63)) % (1 << 64)) - (1 << 63)
    return out


def _plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array, dictionary-decoded: what the per-type mappings take."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    return arr


def zorder_values(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each value's 8 z-order bytes (Java ``BinaryUtil``) as a big-endian ``uint64``."""
    arr = _plain(arr)
    t = arr.type
    if pa.types.is_int64(t) or pa.types.is_uint32(t) or pa.types.is_uint64(t):
        values = _as_numpy(arr.cast(pa.int64()), _LONG_MAX, np.int64)
        return values.view(np.uint64) ^ _SIGN64
    if pa.types.is_int32(t) or pa.types.is_uint16(t) or pa.types.is_int16(t):
        fill = _SHORT_MAX if pa.types.is_int16(t) else _INT_MAX
        values = _as_numpy(arr.cast(pa.int32()), fill, np.int32)
        return (values.view(np.uint32) ^ np.uint32(0x80000000)).astype(np.uint64)
    if pa.types.is_int8(t) or pa.types.is_uint8(t):
        values = _as_numpy(arr, 127, np.int64)
        return (values & 0xFF).astype(np.uint64)  # the raw byte, no sign flip
    if pa.types.is_boolean(t):
        values = _as_numpy(arr, False, np.uint32)
        return (values ^ np.uint32(0x80000000)).astype(np.uint64)
    if pa.types.is_floating(t):
        small = pa.types.is_float32(t) or pa.types.is_float16(t)
        values = _as_numpy(arr.cast(pa.float64()), _FLOAT_MAX if small else _DOUBLE_MAX,
                           np.float64)
        return _flip_double(values)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return _prefix8(arr)
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        millis, nulls = _epoch_millis(arr)
        millis[nulls] = _LONG_MAX
        return millis.view(np.uint64) ^ _SIGN64
    if pa.types.is_decimal(t):
        return _decimal_long(arr, _LONG_MAX).view(np.uint64) ^ _SIGN64
    raise ValueError(f"cannot sort by a column of type {t} on a space-filling curve")


def hilbert_values(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each value's hilbert coordinate (Java ``HilbertCurveUtils``) as a signed ``int64``."""
    arr = _plain(arr)
    t = arr.type
    if pa.types.is_integer(t) and not (pa.types.is_int8(t) or pa.types.is_uint8(t)):
        return _as_numpy(arr.cast(pa.int64()), _LONG_MAX, np.int64)
    if pa.types.is_int8(t) or pa.types.is_uint8(t):
        nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        values = _as_numpy(arr, 0, np.int64) & 0xFF
        values[nulls] = _LONG_MAX
        return values
    if pa.types.is_boolean(t):
        values = _as_numpy(arr, False, bool)
        return np.where(values, np.int64(_LONG_MAX), np.int64(0))
    if pa.types.is_floating(t):
        nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        values = _as_numpy(arr.cast(pa.float64()), 0.0, np.float64)
        bits = values.view(np.int64).copy()
        bits[np.isnan(values)] = 0x7FF8000000000000  # doubleToLongBits: canonical NaN
        bits[nulls] = _LONG_MAX
        return bits
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        values = _prefix8(arr).view(np.int64).copy()
        values[nulls] = _LONG_MAX
        return values
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        millis, nulls = _epoch_millis(arr)
        millis[nulls] = _LONG_MAX
        return millis
    if pa.types.is_decimal(t):
        return _decimal_long(arr, _LONG_MAX)
    raise ValueError(f"cannot sort by a column of type {t} on a space-filling curve")


# -- curves ---------------------------------------------------------------------------------


def interleave(values: Sequence[np.ndarray], bits: int = 64) -> np.ndarray:
    """Interleave the low ``bits`` bits of n ``uint64`` columns MSB-first (bit k of column
    i → output bit k·n + i), packed MSB-first into n words per row: shape (rows, n)."""
    n = len(values)
    rows = len(values[0]) if n else 0
    words = [np.zeros(rows, np.uint64) for _ in range(n)]
    one = np.uint64(1)
    bit = np.empty(rows, np.uint64)
    for k in range(bits):
        shift = np.uint64(bits - 1 - k)
        for i, column in enumerate(values):
            j = k * n + i
            np.right_shift(column, shift, out=bit)
            np.bitwise_and(bit, one, out=bit)
            np.left_shift(bit, np.uint64(63 - j % 64), out=bit)
            np.bitwise_or(words[j // 64], bit, out=words[j // 64])
    return np.stack(words, axis=1) if n else np.zeros((0, 0), np.uint64)


def zorder_words(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Z-order keys, one row of n big-endian words per row."""
    return interleave([zorder_values(c) for c in columns])


def hilbert_transpose(coords: Sequence[np.ndarray], bits: int = HILBERT_BITS) -> list[np.ndarray]:
    """Skilling's transposed Hilbert index of n coordinate columns (davidmoten's
    ``HilbertCurve.transposedIndex``), vectorised over rows; only the low ``bits`` bits of
    each coordinate count (the sign bit is dropped for bits = 63)."""
    mask = np.uint64((1 << bits) - 1)
    x = [np.asarray(c).astype(np.int64).view(np.uint64) & mask for c in coords]
    n = len(x)
    if not n:
        return []
    one = np.uint64(1)
    zero = np.uint64(0)
    bit = np.empty_like(x[0])
    t = np.empty_like(x[0])
    for level in range(bits - 1, 0, -1):  # q = 2^level
        p = np.uint64((1 << level) - 1)
        shift = np.uint64(level)
        for i in range(n):
            # bit = all ones where bit q of x[i] is set (invert x[0]'s low bits), else 0
            np.right_shift(x[i], shift, out=bit)
            np.bitwise_and(bit, one, out=bit)
            np.subtract(zero, bit, out=bit)
            if i:
                # where not set: exchange the low bits of x[0] and x[i]
                np.bitwise_xor(x[0], x[i], out=t)
                np.bitwise_and(t, p, out=t)
                np.bitwise_and(t, ~bit, out=t)
                np.bitwise_xor(x[i], t, out=x[i])
                np.bitwise_xor(x[0], t, out=x[0])
            np.bitwise_and(bit, p, out=bit)
            np.bitwise_xor(x[0], bit, out=x[0])
    for i in range(1, n):
        np.bitwise_xor(x[i], x[i - 1], out=x[i])
    t[:] = 0
    for level in range(bits - 1, 0, -1):
        np.right_shift(x[n - 1], np.uint64(level), out=bit)
        np.bitwise_and(bit, one, out=bit)
        np.subtract(zero, bit, out=bit)
        np.bitwise_and(bit, np.uint64((1 << level) - 1), out=bit)
        np.bitwise_xor(t, bit, out=t)
    return [xi ^ t for xi in x]


def hilbert_words(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Hilbert indexes (bits = 63), one row of n words per row: the 63·n-bit index
    left-aligned in 64·n bits, so word order is index order."""
    coords = [hilbert_values(c) for c in columns]
    return interleave(hilbert_transpose(coords), bits=HILBERT_BITS)


def hilbert_index(point: Sequence[int], bits: int) -> int:
    """The Hilbert index of one point (davidmoten's ``HilbertCurve.bits(b).index``)."""
    transposed = hilbert_transpose([np.array([v], np.int64) for v in point], bits)
    words = interleave([t for t in transposed], bits=bits)[0]
    total = bits * len(point)
    value = 0
    for word in words:
        value = (value << 64) | int(word)
    return value >> (64 * len(point) - total)


def zorder_key_bytes(row: Sequence[pa.Array]) -> list[bytes]:
    """Hudi's z-order key bytes (8·n per row) of columns already in dimension order."""
    return [b"".join(int(w).to_bytes(8, "big") for w in words)
            for words in zorder_words(row)]


def hilbert_key_bytes(columns: Sequence[pa.Array]) -> list[bytes]:
    """Hudi's hilbert key bytes: ``BigInteger.toByteArray()`` of the index, left-padded
    with zeros to 63 bytes (or its first 63 bytes)."""
    n = len(columns)
    out = []
    for words in hilbert_words(columns):
        value = 0
        for word in words:
            value = (value << 64) | int(word)
        value >>= n  # 64·n bits held a left-aligned 63·n-bit index
        raw = value.to_bytes(value.bit_length() // 8 + 1, "big")  # toByteArray (signum 1)
        out.append(raw[:HILBERT_KEY_BYTES].rjust(HILBERT_KEY_BYTES, b"\0"))
    return out


# -- sorting --------------------------------------------------------------------------------


def _lexsort_words(words: np.ndarray) -> np.ndarray:
    if words.shape[0] == 0:
        return np.zeros(0, np.int64)
    keys = tuple(words[:, i] for i in reversed(range(words.shape[1])))
    return np.lexsort(keys).astype(np.int64)


def sort_indices(table: pa.Table, columns: Sequence[str], strategy: str) -> np.ndarray:
    """Row order of ``table`` under a layout strategy over ``columns`` (no columns: the
    rows as they are). The sort is stable, so equal keys keep the input order."""
    if not columns or table.num_rows == 0:
        return np.arange(table.num_rows, dtype=np.int64)
    for name in columns:
        if name not in table.column_names:
            raise ValueError(f"sort column {name!r} is not a column of the table "
                             f"({', '.join(table.column_names)})")
    strategy = normalize_strategy(strategy)
    if strategy == LINEAR or len(columns) == 1:
        keys = [(c, "ascending", "at_start") for c in columns]
        plain = table.select(list(columns))
        plain = pa.table([_undictionary(plain.column(c)) for c in columns], names=list(columns))
        return np.asarray(pc.sort_indices(plain, sort_keys=keys))
    ordered = dimension_order(table.column_names, columns)
    arrays = [table.column(c) for c in ordered]
    words = zorder_words(arrays) if strategy == ZORDER else hilbert_words(arrays)
    return _lexsort_words(words)


def _undictionary(col: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(col.type):
        return col.cast(col.type.value_type)
    return col


def sort_table(table: pa.Table, columns: Sequence[str], strategy: str) -> pa.Table:
    """``table`` reordered by :func:`sort_indices`."""
    if not columns:
        return table
    return table.take(pa.array(sort_indices(table, columns, strategy)))

