"""Hudi's per-row meta columns built straight into Arrow buffers, without a Python object per row.

A write task stamps every record it writes with the same ``_hoodie_commit_time`` and
``_hoodie_file_name`` and with a ``_hoodie_commit_seqno`` of ``<instant>_<task>_<n>`` for
n = 0, 1, … (``HoodieRecord.generateSequenceId``). Built from ``np.full`` object arrays and a
string cast + join, these took ~2 ms of a ~12 ms parquet log block task of 2,500 rows (the MOR
upsert in ``docs/benchmarks.md``); filled by numpy into the string array's offsets and data
buffers they cost a few tens of µs.
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

_INT32_LIMIT = 2**31 - 1


def constant_strings(value: str, n: int) -> pa.Array:
    """A ``string`` array of ``n`` copies of ``value``."""
    raw = value.encode("utf-8")
    if n * len(raw) > _INT32_LIMIT:  # beyond a string array's 32-bit offsets
        return pa.array([value], pa.string()).take(np.zeros(n, np.int64))
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def numbered_strings(prefix: str, n: int) -> pa.Array:
    """A ``string`` array of ``prefix + str(i)`` for i in ``range(n)``."""
    head = np.frombuffer(prefix.encode("utf-8"), dtype=np.uint8)
    width = len(head)
    digits = _digit_counts(n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(digits + width, out=offsets[1:])
    if offsets[-1] > _INT32_LIMIT:
        raise OverflowError(f"{n} sequence numbers do not fit one string array")
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    # The numbers with d digits are consecutive and equally long: one (rows, width + d) block.
    low = 0
    for d in range(1, int(digits[-1]) + 1 if n else 1):
        high = min(n, 10**d)
        block = data[offsets[low]:offsets[high]].reshape(high - low, width + d)
        block[:, :width] = head
        block[:, width:] = _digit_rows(d, low, high)
        low = high
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(data))


_CACHED_DIGITS = 6
"""Numbers of up to this many digits have their digit rows cached (5.4 MB at 6 digits)."""


def _digit_rows(d: int, low: int, high: int) -> np.ndarray:
    """The ASCII digits of the d-digit numbers low … high-1, one row each."""
    if d > _CACHED_DIGITS:
        return _ascii_digits(d, low, high)
    first = 10 ** (d - 1) if d > 1 else 0
    return _all_digit_rows(d)[low - first:high - first]


@functools.lru_cache(maxsize=_CACHED_DIGITS)
def _all_digit_rows(d: int) -> np.ndarray:
    """:func:`_ascii_digits` of every d-digit number (0 … 9 for d = 1), read-only: every
    task numbers its rows from 0, so they are computed once per process."""
    rows = _ascii_digits(d, 10 ** (d - 1) if d > 1 else 0, 10**d)
    rows.flags.writeable = False
    return rows


def _ascii_digits(d: int, low: int, high: int) -> np.ndarray:
    numbers = np.arange(low, high, dtype=np.int64)[:, None]
    powers = 10 ** np.arange(d - 1, -1, -1, dtype=np.int64)
    return (numbers // powers % 10 + 48).astype(np.uint8)


def _digit_counts(n: int) -> np.ndarray:
    """Decimal digits of each of 0 … n-1."""
    counts = np.ones(n, dtype=np.int64)
    bound = 10
    while bound < n:
        counts[bound:] += 1
        bound *= 10
    return counts
