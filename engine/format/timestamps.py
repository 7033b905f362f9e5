"""Timestamp columns: the one form tidelake stores them in, and the casts between forms.

Hudi stores two kinds of timestamp, as Spark has two (Hudi's Spark writer converts schemas with
``org.apache.spark.sql.avro.SchemaConverters.toAvroType``, hudi-spark-common):

========================  =====================================  ===================================
Spark                     Avro (commit schema, log blocks)       parquet INT64 TIMESTAMP(...)
========================  =====================================  ===================================
``TimestampType``         ``timestamp-micros`` (an instant)      ``isAdjustedToUTC=true``
``TimestampNTZType``      ``local-timestamp-micros`` (no zone)   ``isAdjustedToUTC=false``
========================  =====================================  ===================================

Arrow says the same by its ``tz``: pyarrow writes ``timestamp[unit, tz=...]`` with
``isAdjustedToUTC=true`` and ``timestamp[unit]`` with ``isAdjustedToUTC=false``.

tidelake writes every timestamp column as the first kind, ``timestamp-micros`` (``-millis`` for
``s``/``ms`` input) and ``timestamp[us, tz=UTC]`` in parquet and log blocks: an instant given in
another zone is the same instant in UTC, and a value without a zone is taken as UTC wall-clock
time (the epoch value is kept), as this engine has always recorded it. It does not write
``local-timestamp-*``: hudi-rs, the reader our tables are judged by, cannot read such a schema
(``avro_to_arrow/schema.rs`` leaves ``LocalTimestampMicros`` ``todo!()``: it panics), so a
zone-less column comes back as UTC instants (a difference from Hudi's Spark writer, listed in
docs/engine.md). A table whose schema already says ``local-timestamp-*`` (Java wrote it from
``TimestampNTZType``) keeps that kind: writes cast to it. Nanoseconds are stored as
microseconds, seconds as milliseconds (the Avro units).

So the schema a commit records, the parquet files and the log blocks agree on every commit.
Files that do not (a table written before this rule: a zone-less first file, instants after it)
are read as the table's schema says (:func:`cast_timestamps`).

Casts between forms never fail on a value that fits: a narrower unit floors the values, as
Spark's Avro writer does (``DateTimeUtils.microsToMillis`` is a floor division), and a zone-less
value meets an instant as UTC wall-clock time (the epoch value is kept either way).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["cast_timestamps", "differs", "storage_type", "value_as"]

UTC = "UTC"
_FLOOR_UNIT = {"s": "second", "ms": "millisecond", "us": "microsecond", "ns": "nanosecond"}
_ORDER = {"s": 0, "ms": 1, "us": 2, "ns": 3}

ArrayT = TypeVar("ArrayT", pa.Array, pa.ChunkedArray)


def storage_type(t: pa.DataType) -> pa.DataType:
    """The type a timestamp column of input type ``t`` is stored as in a new column (other
    types unchanged): an instant in UTC, whatever zone ``t`` has or lacks; ``ns`` as ``us``,
    ``s`` as ``ms``."""
    if not pa.types.is_timestamp(t):
        return t
    return pa.timestamp({"ns": "us", "s": "ms"}.get(t.unit, t.unit), tz=UTC)


def differs(have: pa.DataType, want: pa.DataType) -> bool:
    """True when both are timestamps of another unit or zone (:func:`cast_timestamps` casts)."""
    return (pa.types.is_timestamp(have) and pa.types.is_timestamp(want)
            and not have.equals(want))


def cast_timestamps(values: ArrayT, target: pa.DataType) -> ArrayT:
    """``values`` (a timestamp array) as ``target`` (a timestamp type): a narrower unit floors
    the values, a zone-less value becomes the instant of that UTC wall-clock time and an
    instant the zone-less UTC wall-clock time (the epoch value is kept either way)."""
    source = values.type
    if source.equals(target):
        return values
    if _ORDER[target.unit] < _ORDER[source.unit]:
        values = pc.floor_temporal(values, unit=_FLOOR_UNIT[target.unit])
    return values.cast(target)


def value_as(value: Any, target: pa.DataType) -> Any:
    """A filter value compared with a timestamp column of type ``target``, in the column's
    kind by the same rule: a zone-less ``datetime`` against instants is that UTC wall-clock
    time, an aware one against a zone-less column its UTC wall-clock time, an aware one
    against instants the same instant in the column's zone (Arrow compares two zones of
    different units with no kernel: ``timestamp[ms, tz=UTC]`` against a ``-04:00`` value
    raises); any other value as it is."""
    if not isinstance(value, dt.datetime) or not pa.types.is_timestamp(target):
        return value
    if target.tz is not None and value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    if target.tz is None and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if target.tz is not None:
        return value.astimezone(_zone(target.tz))
    return value


def _zone(name: str) -> dt.tzinfo:
    """Arrow's time zone ``name`` (``UTC``, ``+01:00``, ``Europe/Oslo``) as a ``tzinfo``."""
    if name.upper() in (UTC, "Z", "ETC/UTC"):
        return dt.timezone.utc
    if len(name) == 6 and name[0] in "+-" and name[3] == ":":
        sign = -1 if name[0] == "-" else 1
        return dt.timezone(sign * dt.timedelta(hours=int(name[1:3]), minutes=int(name[4:6])))
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)
