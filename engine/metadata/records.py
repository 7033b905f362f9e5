"""``HoodieMetadataRecord`` values: typed payloads, Avro coding, builders and merge rules.

A metadata-table cell is (record key, Avro binary value in the schema of
:mod:`engine.metadata.schema`). Coding contracts (doc §3.5, pitfall 8):

* the value's ``key`` field is written as ``""`` (the cell key carries it); decoding restores it
  from the cell key;
* meta fields are null except ``_hoodie_file_name``, which base files set to their own name
  (:attr:`MetadataRecord.file_name`);
* every wrapper union branch is chosen explicitly (``DoubleWrapper`` stays ``DoubleWrapper``):
  a column-stats bound is a :data:`StatValue` ``(wrapper name, value)``;
* a value is decoded with the schema of the file that holds it (Hudi 1.0's, or 1.1's with
  ``valueType``: :mod:`engine.metadata.schema`); a stats record with a ``valueType``
  (:class:`ValueTypeInfo`, table version 9) keeps its bounds in the column's own unit and
  scale (``docs/table-version-9.md`` §5.2), one without it in Hudi 1.0's wrappers.
  :func:`bound_value` reads either into one comparable domain.

Payloads by record type: 1 ``__all_partitions__`` and 2 a partition's files
(``{name: FileInfo}``), 3 column stats and 6 partition stats (:class:`ColumnStats`), 4
:class:`BloomFilterInfo`, 5 :class:`RecordIndexInfo`, 7 :class:`SecondaryIndexInfo`.
:func:`merge_records` applies §5's rules for two versions of one key. Everything is immutable
and picklable.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import io
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, NamedTuple

import fastavro
import pyarrow as pa

from engine.metadata import keys
from engine.metadata.schema import META_FIELDS, parsed_metadata_schema, parsed_writer_schema

__all__ = [
    "ALL_PARTITIONS",
    "BLOOM_FILTER",
    "COLUMN_STATS",
    "FILE_LIST",
    "PARTITION_STATS",
    "RECORD_INDEX",
    "SECONDARY_INDEX",
    "BloomFilterInfo",
    "ColumnStats",
    "FileInfo",
    "MetadataRecord",
    "RecordIndexInfo",
    "SecondaryIndexInfo",
    "StatValue",
    "ValueType",
    "ValueTypeInfo",
    "all_partitions_record",
    "bloom_filter_record",
    "bound_value",
    "bounds_unknown",
    "column_stats_record",
    "decode_metadata_value",
    "encode_metadata_value",
    "instant_to_epoch_ms",
    "merge_records",
    "partition_files_record",
    "partition_stats_record",
    "pick_bound",
    "record_index_record",
    "secondary_index_record",
    "with_value_type",
    "wrap_stat_value",
]

ALL_PARTITIONS, FILE_LIST, COLUMN_STATS, BLOOM_FILTER = 1, 2, 3, 4
RECORD_INDEX, PARTITION_STATS, SECONDARY_INDEX = 5, 6, 7
_NS = "org.apache.hudi.avro.model."
_DECIMAL_SCALE = 15

StatValue = tuple[str, Any]
"""A column-stats bound: wrapper record name without namespace (``"DoubleWrapper"``), value."""


@dataclass(frozen=True)
class FileInfo:
    """``HoodieMetadataFileInfo``: a file's size, or a tombstone (``size 0, is_deleted``)."""

    size: int
    is_deleted: bool = False


class ValueType(enum.IntEnum):
    """Hudi 1.1's ``ValueType`` (``hudi-common/.../stats/ValueType.java``): what a stats
    record's bounds are, by ordinal (``HoodieValueTypeInfo.typeOrdinal``). ``V1`` is never
    written (a V1 record has no ``valueType``)."""

    V1 = 0
    NULL = 1
    BOOLEAN = 2
    INT = 3
    LONG = 4
    FLOAT = 5
    DOUBLE = 6
    STRING = 7
    BYTES = 8
    FIXED = 9
    DECIMAL = 10
    UUID = 11
    DATE = 12
    TIME_MILLIS = 13
    TIME_MICROS = 14
    TIMESTAMP_MILLIS = 15
    TIMESTAMP_MICROS = 16
    TIMESTAMP_NANOS = 17
    LOCAL_TIMESTAMP_MILLIS = 18
    LOCAL_TIMESTAMP_MICROS = 19
    LOCAL_TIMESTAMP_NANOS = 20


class ValueTypeInfo(NamedTuple):
    """``HoodieValueTypeInfo``: the ``ValueType`` ordinal of a V2 stats record and its
    additional info (``"<precision>,<scale>"`` for ``DECIMAL``)."""

    ordinal: int
    additional_info: str | None = None


@dataclass(frozen=True)
class ColumnStats:
    """``HoodieMetadataColumnStats`` (column_stats and partition_stats records)."""

    file_name: str | None
    column_name: str | None
    min_value: StatValue | None
    max_value: StatValue | None
    value_count: int | None
    null_count: int | None
    total_size: int | None
    total_uncompressed_size: int | None
    is_deleted: bool = False
    is_tight_bound: bool = False
    value_type: ValueTypeInfo | None = None
    """``valueType``: None for a V1 record (Hudi 1.0 wrappers), else how the bounds read."""


_NANOS_PER = {ValueType.TIMESTAMP_MILLIS: 1_000_000, ValueType.TIMESTAMP_MICROS: 1_000,
              ValueType.TIMESTAMP_NANOS: 1, ValueType.LOCAL_TIMESTAMP_MILLIS: 1_000_000,
              ValueType.LOCAL_TIMESTAMP_MICROS: 1_000, ValueType.LOCAL_TIMESTAMP_NANOS: 1}


def bound_value(value: StatValue, value_type: ValueTypeInfo | None) -> Any:
    """A stats bound in its column's own domain, comparable across records of either
    layout: decimals as ``Decimal`` (V2: unscaled big-endian bytes at the scale
    ``additionalInfo`` names), dates as epoch days, timestamps (any unit, local or not) as
    epoch **nanoseconds**, times as ``datetime.time``, anything else as wrapped. Raises
    ``ValueError`` for a value type it does not know (the caller then cannot compare)."""
    name, v = value
    if value_type is None:  # V1: Hudi 1.0's wrappers (docs/table-version-9.md §5.2)
        if name == "TimestampMicrosWrapper":
            return int(v) * 1_000
        return v
    try:
        kind = ValueType(value_type.ordinal)
    except ValueError:
        raise ValueError(f"column stats value type {value_type.ordinal} is unknown") from None
    if kind is ValueType.DECIMAL:
        if not isinstance(v, bytes) or not value_type.additional_info:
            raise ValueError(f"decimal bound {v!r} without bytes and precision,scale")
        scale = int(value_type.additional_info.split(",")[1])
        return Decimal(int.from_bytes(v, "big", signed=True)).scaleb(-scale)
    if kind in _NANOS_PER:
        return int(v) * _NANOS_PER[kind]
    if kind in (ValueType.TIME_MILLIS, ValueType.TIME_MICROS):
        micros = int(v) * (1_000 if kind is ValueType.TIME_MILLIS else 1)
        return (dt.datetime.min + dt.timedelta(microseconds=micros)).time()
    return v


def bounds_unknown(s: ColumnStats) -> bool:
    """True when a stats entry has non-null values but no bounds (nothing can be ruled
    out from it)."""
    if s.value_count is None or s.null_count is None or s.value_count < 0:
        return True
    return s.value_count > s.null_count and (s.min_value is None or s.max_value is None)


@dataclass(frozen=True)
class BloomFilterInfo:
    """``HoodieMetadataBloomFilter``: a base file's bloom filter (bytes of its Base64 text)."""

    type: str
    timestamp: str
    bloom_filter: bytes
    is_deleted: bool = False


@dataclass(frozen=True)
class RecordIndexInfo:
    """``HoodieRecordIndexInfo``: where a record key lives (encoding 0: UUID bits, 1: raw)."""

    partition_name: str | None
    file_id_high_bits: int | None
    file_id_low_bits: int | None
    file_index: int | None
    file_id: str | None
    instant_time: int | None  # epoch milliseconds
    file_id_encoding: int = 0
    position: int | None = None

    @functools.cached_property
    def location_file_id(self) -> str:
        """The data file group id this entry points at (computed once: the entries of a
        file group share one payload, see :class:`engine.metadata.codec.CellDecoder`)."""
        if self.file_id_encoding == 1:
            return self.file_id or ""
        hi, lo = self.file_id_high_bits or 0, self.file_id_low_bits or 0
        text = str(uuid.UUID(int=((hi & (2**64 - 1)) << 64) | (lo & (2**64 - 1))))
        index = self.file_index if self.file_index is not None else -1
        return text if index < 0 else f"{text}-{index}"


@dataclass(frozen=True)
class SecondaryIndexInfo:
    """``HoodieSecondaryIndexInfo``."""

    is_deleted: bool = False


Payload = Mapping[str, FileInfo] | ColumnStats | BloomFilterInfo | RecordIndexInfo | \
    SecondaryIndexInfo


class MetadataRecord(NamedTuple):
    """One metadata-table record: cell key, record type, typed payload, base file name.

    A named tuple rather than a frozen dataclass: a record index of a million keys is a
    million records, and a tuple is made in a fifth of the time (change one with
    ``_replace``)."""

    key: str
    type: int
    payload: Payload
    file_name: str | None = None  # ``_hoodie_file_name``: set in base files only


# --------------------------------------------------------------------------------------------
# Avro coding
# --------------------------------------------------------------------------------------------


def _wrap(value: StatValue | None) -> Any:
    return None if value is None else (_NS + value[0], {"value": value[1]})


def _unwrap(value: Any) -> StatValue | None:
    if value is None:
        return None
    name, record = value
    return name.rsplit(".", 1)[-1], record["value"]


def _to_avro(record: MetadataRecord) -> dict[str, Any]:
    datum: dict[str, Any] = dict.fromkeys(META_FIELDS)
    datum["_hoodie_file_name"] = record.file_name
    datum.update(key="", type=record.type, filesystemMetadata=None, BloomFilterMetadata=None,
                 ColumnStatsMetadata=None, recordIndexMetadata=None,
                 SecondaryIndexMetadata=None)
    p = record.payload
    if record.type in (ALL_PARTITIONS, FILE_LIST):
        assert isinstance(p, Mapping)
        datum["filesystemMetadata"] = {
            name: {"size": info.size, "isDeleted": info.is_deleted} for name, info in p.items()}
    elif isinstance(p, ColumnStats):
        datum["ColumnStatsMetadata"] = {
            "fileName": p.file_name, "columnName": p.column_name,
            "minValue": _wrap(p.min_value), "maxValue": _wrap(p.max_value),
            "valueCount": p.value_count, "nullCount": p.null_count,
            "totalSize": p.total_size, "totalUncompressedSize": p.total_uncompressed_size,
            "isDeleted": p.is_deleted, "isTightBound": p.is_tight_bound,
            "valueType": None if p.value_type is None else {
                "typeOrdinal": p.value_type.ordinal,
                "additionalInfo": p.value_type.additional_info}}
    elif isinstance(p, BloomFilterInfo):
        datum["BloomFilterMetadata"] = {"type": p.type, "timestamp": p.timestamp,
                                        "bloomFilter": p.bloom_filter, "isDeleted": p.is_deleted}
    elif isinstance(p, RecordIndexInfo):
        datum["recordIndexMetadata"] = {
            "partitionName": p.partition_name, "fileIdHighBits": p.file_id_high_bits,
            "fileIdLowBits": p.file_id_low_bits, "fileIndex": p.file_index,
            "fileId": p.file_id, "instantTime": p.instant_time,
            "fileIdEncoding": p.file_id_encoding, "position": p.position}
    elif isinstance(p, SecondaryIndexInfo):
        datum["SecondaryIndexMetadata"] = {"isDeleted": p.is_deleted}
    else:
        raise ValueError(f"record type {record.type} does not match payload {type(p).__name__}")
    return datum


_V2_OF_V1 = {
    "BooleanWrapper": ("BooleanWrapper", ValueType.BOOLEAN),
    "IntWrapper": ("IntWrapper", ValueType.INT),
    "LongWrapper": ("LongWrapper", ValueType.LONG),
    "FloatWrapper": ("FloatWrapper", ValueType.FLOAT),
    "DoubleWrapper": ("DoubleWrapper", ValueType.DOUBLE),
    "StringWrapper": ("StringWrapper", ValueType.STRING),
    "BytesWrapper": ("BytesWrapper", ValueType.BYTES),
    "DateWrapper": ("IntWrapper", ValueType.DATE),
    "LocalDateWrapper": ("IntWrapper", ValueType.DATE),
    "TimestampMicrosWrapper": ("LongWrapper", ValueType.TIMESTAMP_MICROS),
}
"""V1 wrapper → (V2 wrapper, ``ValueType``), the value unchanged (V1 timestamps are UTC
micros, dates epoch days: ``docs/table-version-9.md`` §5.2)."""
_V1_DECIMAL_INFO = f"30,{_DECIMAL_SCALE}"


def _v2_bound(value: StatValue | None) -> tuple[StatValue | None, ValueTypeInfo | None]:
    if value is None:
        return None, None
    name, v = value
    if name == "DecimalWrapper":  # decimal(30, 15): unscaled bytes at scale 15
        unscaled = int(Decimal(v).scaleb(_DECIMAL_SCALE).to_integral_exact())
        size = max(1, (unscaled.bit_length() + 8) // 8)
        return (("BytesWrapper", unscaled.to_bytes(size, "big", signed=True)),
                ValueTypeInfo(ValueType.DECIMAL, _V1_DECIMAL_INFO))
    if name == "TimeMicrosWrapper":
        micros = (v.hour * 3600 + v.minute * 60 + v.second) * 1_000_000 + v.microsecond
        return ("LongWrapper", micros), ValueTypeInfo(ValueType.TIME_MICROS)
    if name not in _V2_OF_V1:
        raise ValueError(f"no V2 layout for a {name} bound")
    wrapper, kind = _V2_OF_V1[name]
    return (wrapper, v), ValueTypeInfo(kind)


def with_value_type(stats: ColumnStats) -> ColumnStats:
    """``stats`` in the V2 layout (table version 9's column / partition stats): unchanged
    if it already has a ``value_type``; a V1 record's bounds moved to the V2 wrapper of their
    type (dates ``IntWrapper``, timestamps ``LongWrapper`` in micros, decimals unscaled
    bytes at V1's scale 15); a record without bounds is ``NULL``, as Hudi 1.1 writes a
    file without values of the column."""
    if stats.value_type is not None:
        return stats
    lo, lo_type = _v2_bound(stats.min_value)
    hi, hi_type = _v2_bound(stats.max_value)
    value_type = lo_type or hi_type or ValueTypeInfo(ValueType.NULL)
    if lo_type is not None and hi_type is not None and lo_type != hi_type:
        raise ValueError(f"column stats of {stats.column_name!r}: bounds of two types")
    return replace(stats, min_value=lo, max_value=hi, value_type=value_type)


def _value_type_info(datum: Mapping[str, Any] | None) -> ValueTypeInfo | None:
    if datum is None:
        return None
    return ValueTypeInfo(int(datum["typeOrdinal"]), datum.get("additionalInfo"))


def encode_metadata_value(record: MetadataRecord, value_types: bool = False) -> bytes:
    """The Avro binary cell value of ``record`` (``key`` written as ``""``) in Hudi 1.0's
    schema, or with ``value_types`` in 1.1's (table version 9). ``ValueError`` for a V2
    stats record (one with a ``value_type``) in 1.0's schema, which cannot say how its
    bounds read."""
    p = record.payload
    if not value_types and isinstance(p, ColumnStats) and p.value_type is not None:
        raise ValueError(f"metadata record {record.key!r}: V2 column stats need the "
                         "schema with valueType (table version 9)")
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed_metadata_schema(value_types), _to_avro(record))
    return out.getvalue()


def decode_metadata_value(key: str | bytes, value: bytes,
                          schema: str | None = None) -> MetadataRecord:
    """Decode a cell; ``key`` (the cell's row) becomes :attr:`MetadataRecord.key`.
    ``schema`` is the writer schema of the file holding the cell (its HFile file info
    ``schema`` or log block ``SCHEMA`` header); None reads it as Hudi 1.0 wrote it.

    Raises ``ValueError`` naming the key when the value is not a metadata record.
    """
    text_key = key.decode("utf-8") if isinstance(key, bytes) else key
    try:
        parsed = parsed_metadata_schema() if schema is None else parsed_writer_schema(schema)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise ValueError(f"metadata record {text_key!r}: unreadable writer schema: "
                         f"{exc}") from None
    try:
        datum = fastavro.schemaless_reader(
            io.BytesIO(value), parsed, None,
            return_record_name=True, return_record_name_override=True)
    except (EOFError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"metadata record {text_key!r}: malformed Avro value: {exc}") from None
    assert isinstance(datum, dict)
    record_type = int(datum["type"])
    payload: Payload
    if datum["filesystemMetadata"] is not None:
        payload = {name: FileInfo(int(i["size"]), bool(i["isDeleted"]))
                   for name, i in datum["filesystemMetadata"].items()}
    elif (c := datum["ColumnStatsMetadata"]) is not None:
        payload = ColumnStats(c["fileName"], c["columnName"], _unwrap(c["minValue"]),
                              _unwrap(c["maxValue"]), c["valueCount"], c["nullCount"],
                              c["totalSize"], c["totalUncompressedSize"], c["isDeleted"],
                              c["isTightBound"], _value_type_info(c.get("valueType")))
    elif (b := datum["BloomFilterMetadata"]) is not None:
        payload = BloomFilterInfo(b["type"], b["timestamp"], b["bloomFilter"], b["isDeleted"])
    elif (r := datum["recordIndexMetadata"]) is not None:
        payload = RecordIndexInfo(r["partitionName"], r["fileIdHighBits"], r["fileIdLowBits"],
                                  r["fileIndex"], r["fileId"], r["instantTime"],
                                  r["fileIdEncoding"], r["position"])
    elif (s := datum["SecondaryIndexMetadata"]) is not None:
        payload = SecondaryIndexInfo(s["isDeleted"])
    elif record_type in (ALL_PARTITIONS, FILE_LIST):
        payload = {}
    else:
        raise ValueError(f"metadata record {text_key!r} of type {record_type} has no payload")
    return MetadataRecord(text_key, record_type, payload, datum["_hoodie_file_name"])


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


def all_partitions_record(partitions: Iterable[str], deleted: Iterable[str] = ()) -> MetadataRecord:
    """The ``__all_partitions__`` record (type 1): partitions touched, and dropped ones."""
    entries = {keys.partition_identifier(p): FileInfo(0, False) for p in partitions}
    entries.update({keys.partition_identifier(p): FileInfo(0, True) for p in deleted})
    return MetadataRecord(keys.ALL_PARTITIONS_KEY, ALL_PARTITIONS, entries)


def partition_files_record(
    partition_path: str, added: Mapping[str, int], deleted: Iterable[str] = ()
) -> MetadataRecord:
    """A partition's files record (type 2): added file name -> size (> 0), deleted names.

    ``ValueError`` for a size <= 0 (Java refuses it) or a name with a directory.
    """
    entries: dict[str, FileInfo] = {}
    for name, size in added.items():
        if size <= 0 or "/" in name:
            raise ValueError(f"file {name!r}: sizes must be > 0 and names have no directory")
        entries[name] = FileInfo(int(size), False)
    entries.update({name: FileInfo(0, True) for name in deleted})
    return MetadataRecord(keys.partition_identifier(partition_path), FILE_LIST, entries)


def wrap_stat_value(value: Any, arrow_type: pa.DataType) -> StatValue | None:
    """A min/max of a column of ``arrow_type`` in its wrapper branch (None stays None).

    bool Boolean, 8-32 bit ints Int, 64 bit Long, float32 Float, float64 Double, strings
    String, binaries Bytes, dates Date (days), decimals Decimal (rescaled to scale 15),
    timestamps TimestampMicros (micros since the epoch), times TimeMicros. The date and
    timestamp choices follow ``HoodieTableMetadataUtil.wrapValueIntoAvro`` [U for 1.0.x].
    """
    if value is None:
        return None
    t = arrow_type
    if pa.types.is_boolean(t):
        return "BooleanWrapper", bool(value)
    if pa.types.is_integer(t):
        return ("LongWrapper" if t.bit_width == 64 else "IntWrapper"), int(value)
    if pa.types.is_float32(t) or pa.types.is_float16(t):
        return "FloatWrapper", float(value)
    if pa.types.is_floating(t):
        return "DoubleWrapper", float(value)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "StringWrapper", str(value)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "BytesWrapper", bytes(value)
    if pa.types.is_date(t):
        days = value if isinstance(value, int) else (value - dt.date(1970, 1, 1)).days
        return "DateWrapper", int(days)
    if pa.types.is_decimal(t):
        return "DecimalWrapper", Decimal(value).quantize(Decimal(1).scaleb(-_DECIMAL_SCALE))
    if pa.types.is_timestamp(t):
        micros = pa.scalar(value, t).cast(pa.timestamp("us", t.tz)).cast(pa.int64()).as_py()
        return "TimestampMicrosWrapper", int(micros)
    if pa.types.is_time(t):
        return "TimeMicrosWrapper", pa.scalar(value, t).cast(pa.time64("us")).as_py()
    raise ValueError(f"no column-stats wrapper for Arrow type {t}")


def column_stats_record(
    partition_path: str, file_name: str, column: str, stats: ColumnStats
) -> MetadataRecord:
    """A column_stats record (type 3) of ``column`` in ``file_name`` (name, no directory)."""
    payload = replace(stats, file_name=file_name, column_name=column)
    return MetadataRecord(keys.column_stats_key(column, partition_path, file_name),
                          COLUMN_STATS, payload)


def partition_stats_record(partition_path: str, column: str, stats: ColumnStats) -> MetadataRecord:
    """A partition_stats record (type 6): ``fileName`` = the partition path, tight bound."""
    payload = replace(stats, file_name=partition_path, column_name=column, is_tight_bound=True)
    return MetadataRecord(keys.partition_stats_key(column, partition_path), PARTITION_STATS,
                          payload)


def bloom_filter_record(
    partition_path: str, file_name: str, instant_time: str, serialized: str | None,
    type_code: str = "DYNAMIC_V0",
) -> MetadataRecord:
    """A bloom_filters record (type 4); ``serialized`` None writes the delete form."""
    info = (BloomFilterInfo("", instant_time, b"", True) if serialized is None
            else BloomFilterInfo(type_code, instant_time, serialized.encode("ascii")))
    return MetadataRecord(keys.bloom_filter_key(partition_path, file_name), BLOOM_FILTER, info)


def instant_to_epoch_ms(instant_time: str, tz: dt.tzinfo = dt.timezone.utc) -> int:
    """Epoch milliseconds of a 17-digit instant (``yyyyMMddHHmmssSSS``) read in ``tz``."""
    if len(instant_time) != 17 or not instant_time.isdigit():
        raise ValueError(f"instant {instant_time!r} is not 17 digits")
    moment = dt.datetime.strptime(instant_time[:14], "%Y%m%d%H%M%S").replace(tzinfo=tz)
    return int(moment.timestamp()) * 1000 + int(instant_time[14:])


def record_index_record(
    record_key: str, partition_path: str, file_id: str, instant_time: str,
    tz: dt.tzinfo = dt.timezone.utc,
) -> MetadataRecord:
    """A record_index record (type 5) pointing ``record_key`` at ``file_id``.

    ``<uuid>-<n>`` (or a bare UUID) file ids use encoding 0 (UUID halves as signed longs,
    ``n`` or -1); any other id encoding 1 (raw string, bits and index -1).
    """
    head, tail = file_id[:36], file_id[36:]
    try:
        parsed = uuid.UUID(head) if len(head) == 36 else None
    except ValueError:
        parsed = None
    ms = instant_to_epoch_ms(instant_time, tz)
    if parsed is not None and str(parsed) == head.lower() and (
            tail == "" or (tail[:1] == "-" and tail[1:].isdigit())):
        def signed(v: int) -> int:
            return v - (1 << 64) if v >= 1 << 63 else v
        info = RecordIndexInfo(partition_path, signed(parsed.int >> 64),
                               signed(parsed.int & (2**64 - 1)),
                               int(tail[1:]) if tail else -1, "", ms, 0)
    else:
        info = RecordIndexInfo(partition_path, -1, -1, -1, file_id, ms, 1)
    return MetadataRecord(record_key, RECORD_INDEX, info)


def secondary_index_record(secondary_value: str | None, record_key: str) -> MetadataRecord:
    """A secondary-index record (type 7); removals are delete-block entries instead."""
    return MetadataRecord(keys.secondary_index_key(secondary_value, record_key),
                          SECONDARY_INDEX, SecondaryIndexInfo(False))


# --------------------------------------------------------------------------------------------
# Merge rules (doc §5)
# --------------------------------------------------------------------------------------------


def _merge_files(
    older: Mapping[str, FileInfo], newer: Mapping[str, FileInfo]
) -> dict[str, FileInfo]:
    merged = dict(older)
    for name, new in newer.items():
        old = merged.get(name)
        if old is None:
            merged[name] = new
        elif new.is_deleted:
            if old.is_deleted:
                merged[name] = new
            else:
                del merged[name]
        else:
            merged[name] = FileInfo(max(old.size, new.size), False)
    return merged


def pick_bound(a: StatValue | None, b: StatValue | None, pick: Any,
               value_type: ValueTypeInfo | None) -> StatValue | None:
    """``pick`` (``min`` or ``max``) of two bounds of one layout (``value_type``), compared
    in their column's domain (:func:`bound_value`); None stands for no bound."""
    if a is None:
        return b
    if b is None:
        return a
    ka, kb = bound_value(a, value_type), bound_value(b, value_type)
    return a if pick(ka, kb) == ka else b


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


def _merge_stats(older: ColumnStats, newer: ColumnStats) -> ColumnStats:
    if older.is_deleted or newer.is_deleted or newer.is_tight_bound:
        return newer
    value_type = newer.value_type
    if older.min_value is None and older.max_value is None:
        lo, hi = newer.min_value, newer.max_value
    elif newer.min_value is None and newer.max_value is None:
        lo, hi, value_type = older.min_value, older.max_value, older.value_type
    elif older.value_type != newer.value_type:
        # V1 beside V2 (a table Java upgraded), or a column whose type changed: the bounds
        # do not share a layout, so the merged entry keeps none (nothing is pruned by it).
        lo = hi = None
    else:
        try:
            lo = pick_bound(older.min_value, newer.min_value, min, value_type)
            hi = pick_bound(older.max_value, newer.max_value, max, value_type)
        except (ValueError, TypeError):
            lo = hi = None
    return replace(
        newer,
        value_type=value_type,
        min_value=lo,
        max_value=hi,
        value_count=_sum(older.value_count, newer.value_count),
        null_count=_sum(older.null_count, newer.null_count),
        total_size=_sum(older.total_size, newer.total_size),
        total_uncompressed_size=_sum(older.total_uncompressed_size,
                                     newer.total_uncompressed_size))


def merge_records(
    older: MetadataRecord | None, newer: MetadataRecord | None
) -> MetadataRecord | None:
    """Merge two versions of one key, ``older`` first; None stands for a delete.

    A delete wins over anything older; after a delete the newer record stands alone. files
    (types 1, 2): union, a newer tombstone removes a live entry (a tombstone over a tombstone
    or over nothing stays), live entries keep the larger size. Column/partition stats: a
    deleted side or a tight newer bound wins, else min of mins, max of maxes, counts summed.
    Bloom filter and record index: newer wins. Secondary index: newer wins, a deleted one is
    dropped (None).
    """
    if newer is None or older is None:
        result = newer
    elif newer.type in (ALL_PARTITIONS, FILE_LIST):
        assert isinstance(older.payload, Mapping) and isinstance(newer.payload, Mapping)
        result = newer._replace(payload=_merge_files(older.payload, newer.payload))
    elif isinstance(newer.payload, ColumnStats) and isinstance(older.payload, ColumnStats):
        result = newer._replace(payload=_merge_stats(older.payload, newer.payload))
    else:
        result = newer
    if result is not None and isinstance(result.payload, SecondaryIndexInfo) \
            and result.payload.is_deleted:
        return None
    return result
