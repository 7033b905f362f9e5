"""Hudi delete blocks: the keys a deltacommit deletes, with their ordering values.

Content (version 3, ``HoodieDeleteBlock``)::

    version=3: i32 (BE) | length: i32 (BE) | Avro binary HoodieDeleteRecordList

``HoodieDeleteRecordList`` is Hudi's own schema (``engine/format/avro/HoodieDeleteRecordList.avsc``,
the copy hudi-rs 0.5.0 embeds): an array of ``{recordKey, partitionPath, orderingVal}``, where
``orderingVal`` is a union of ``null`` and one-field *wrapper records* (``BooleanWrapper``=1,
``IntWrapper``=2, ``LongWrapper``=3, ``FloatWrapper``=4, ``DoubleWrapper``=5,
``BytesWrapper``=6, ``StringWrapper``=7, ``DateWrapper``=8, ``DecimalWrapper``=9,
``TimeMicrosWrapper``=10, ``TimestampMicrosWrapper``=11, ``ArrayWrapper``=12 from Hudi 1.1).
A one-field record encodes exactly like its field, so ``LongWrapper(5)`` is ``06 0a``.

Every delete in the Spark-written samples (v6, v8, data table and metadata table alike) is
``04 00`` = ``IntWrapper(0)``: Java's default ordering value, which Java's merge code and
hudi-rs both treat as *natural order* (the delete wins over all earlier writes). Versions 1 and
2 of the content were Java Kryo and are neither read nor written.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from typing import Any

import numpy as np
import pyarrow as pa

from engine.format.avro_codec import encode_records
from engine.format.avro_schema import PRIMITIVE_TO_ARROW
from engine.format.log_block import (
    I32_PAIR,
    BlockType,
    HeaderKey,
    LogBlock,
    LogFormatError,
    frame_parts,
    schema_json,
)

__all__ = [
    "DELETE_BLOCK_VERSION",
    "ORDERING_KINDS",
    "DeleteRecord",
    "decode_delete_block",
    "delete_record_list_schema",
    "encode_delete_block",
    "encode_delete_content",
    "ordering_as",
    "ordering_kind",
]

DELETE_BLOCK_VERSION = 3


@dataclass(frozen=True)
class DeleteRecord:
    """One entry of a delete block.

    ``ordering_value`` None means *natural order*: the delete wins over every earlier write of
    the key, whatever its ordering value (Java's and hudi-rs's reading of ``IntWrapper(0)``).
    """

    record_key: str
    partition_path: str
    # int (int, long, date days, time/timestamp micros), float, str, bytes, bool, Decimal, None
    ordering_value: object | None = None


# Union branches of HoodieDeleteRecord.orderingVal: null, then the wrapper records of
# HoodieMetadata.avsc (a one-field record encodes exactly like its field). The keys are the
# *ordering kinds* a table's ordering field can have (see ordering_kind).
_ORDERING_BRANCH = {
    "boolean": 1,
    "int": 2,
    "long": 3,
    "float": 4,
    "double": 5,
    "bytes": 6,
    "string": 7,
    "date": 8,  # DateWrapper: days since the epoch (int)
    "decimal": 9,  # DecimalWrapper: decimal(30, 15), unscaled two's complement bytes
    "time-micros": 10,  # TimeMicrosWrapper: microseconds since midnight (long)
    "timestamp-micros": 11,  # TimestampMicrosWrapper: UTC microseconds since the epoch (long)
}
ORDERING_KINDS = frozenset(_ORDERING_BRANCH)
"""The ordering kinds delete blocks encode (:func:`ordering_kind`)."""
# The Avro type each kind's value is encoded as (the wrapper's one field).
_VALUE_TYPE = {
    "boolean": "boolean", "int": "int", "long": "long", "float": "float", "double": "double",
    "bytes": "bytes", "string": "string", "date": "int", "decimal": "bytes",
    "time-micros": "long", "timestamp-micros": "long",
}
_NATURAL_BRANCH = 2  # IntWrapper(0): Java's default ordering value, "natural order"
_INTEGRAL_BRANCHES = frozenset({2, 3, 8, 10, 11})
_DECIMAL_SCALE = 15
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_ORDERING_ARROW = {name: arrow for name, arrow in PRIMITIVE_TO_ARROW.items() if name != "null"}
_ORDERING_ZERO: dict[str, Any] = {
    "boolean": False,
    "int": 0,
    "long": 0,
    "float": 0.0,
    "double": 0.0,
    "bytes": b"",
    "string": "",
}


def ordering_kind(arrow_type: pa.DataType) -> str | None:
    """The delete-block ordering kind of an ordering field of ``arrow_type`` (None: not one).

    The one map from Arrow types to ``orderingVal`` wrappers. Values are wrapped as Java's
    Spark writer holds them: 8/16/32-bit integers and dates (days) ``int``; 64-bit integers and
    timestamps (in the field's own unit, as stored) ``long``; times ``int``/``long`` as stored;
    ``float``/``double``; ``string``; ``bytes``; ``boolean``; decimals ``decimal``
    (``DecimalWrapper``, rescaled to decimal(30, 15)). hudi-rs 0.5.0 reads all of them against
    the field (checked: a ``LongWrapper`` of milliseconds against a ``timestamp-millis``
    field); its ``TimestampMicrosWrapper`` reading would misjudge a millisecond field.
    """
    t = arrow_type
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "long" if t.bit_width == 64 else "int"
    if pa.types.is_float32(t) or pa.types.is_float16(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    if pa.types.is_date(t):
        return "int"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_time32(t):
        return "int"
    if pa.types.is_time64(t) or pa.types.is_timestamp(t):
        return "long"
    return None


def ordering_as(values: pa.Array, target: pa.DataType) -> pa.Array:
    """Ordering values read from a delete block as ``target``, the ordering field's type: the
    inverse of how :func:`ordering_kind` wraps them (integers stand for dates, in days, and for
    times and timestamps in ``target``'s own unit)."""
    if values.type.equals(target):
        return values
    kind = ordering_kind(target)
    if pa.types.is_integer(values.type) and pa.types.is_temporal(target) \
            and kind in ("int", "long"):
        values = values.cast(pa.int32() if kind == "int" else pa.int64())
        if pa.types.is_date(target):
            values = values.cast(pa.date32())
    return values.cast(target)


def _unscaled_bytes(value: Decimal) -> bytes:
    """``value`` at scale 15 as Avro decimal bytes: big-endian two's complement, minimal."""
    unscaled = int(value.scaleb(_DECIMAL_SCALE).to_integral_value())
    length = max(1, (unscaled + (unscaled < 0)).bit_length() // 8 + 1)
    return unscaled.to_bytes(length, "big", signed=True)


def _encodable(values: pa.Array, kind: str) -> pa.Array:
    """Ordering values of ``kind`` as the Arrow type of the wrapper's Avro field (dates as
    days, times and timestamps as integers in their own unit)."""
    t = values.type
    if kind == "decimal":
        raw = [None if v is None else _unscaled_bytes(Decimal(v)) for v in values.to_pylist()]
        return pa.array(raw, pa.binary())
    if pa.types.is_date64(t):
        values, t = values.cast(pa.date32()), pa.date32()
    if kind == "timestamp-micros" and pa.types.is_timestamp(t):
        values = values.cast(pa.timestamp("us", tz=t.tz))
    if kind == "time-micros" and pa.types.is_time(t):
        values = values.cast(pa.time64("us"))
    value_type = _VALUE_TYPE[kind]
    if pa.types.is_temporal(values.type):
        values = values.cast(pa.int32() if value_type == "int" else pa.int64())
    return values.cast(_ORDERING_ARROW[value_type])


@functools.cache
def delete_record_list_schema() -> dict[str, Any]:
    """Hudi's ``HoodieDeleteRecordList`` Avro schema (``engine/format/avro/*.avsc``)."""
    text = resources.files("engine.format").joinpath(
        "avro", "HoodieDeleteRecordList.avsc").read_text()
    return dict(json.loads(text))


def _delete_table(
    records: Sequence[DeleteRecord] | pa.Table, ordering_type: str | None
) -> tuple[pa.Array, pa.Array, pa.Array | None]:
    """Keys, partition paths and ordering values (None: no ordering column) as Arrow arrays."""
    if isinstance(records, pa.Table):
        keys = records.column("_hoodie_record_key").combine_chunks()
        parts = records.column("_hoodie_partition_path").combine_chunks()
        ordering = (
            records.column("ordering").combine_chunks()
            if "ordering" in records.column_names
            else None
        )
    else:
        keys = pa.array([r.record_key for r in records], pa.string())
        parts = pa.array([r.partition_path for r in records], pa.string())
        values = [r.ordering_value for r in records]
        ordering = None
        if any(v is not None for v in values):
            if ordering_type is None:
                raise ValueError(
                    "ordering_type is required when delete records carry ordering values"
                )
            ordering = pa.array(values)
    if keys.null_count or parts.null_count:
        raise ValueError("delete records need a record key and a partition path (may be '')")
    if ordering is not None and ordering.null_count == len(ordering):
        ordering = None
    if ordering is not None:
        if ordering_type is None:
            raise ValueError("ordering_type is required when delete records carry ordering values")
        try:
            ordering = _encodable(ordering, ordering_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ArithmeticError) as exc:
            raise ValueError(f"ordering values do not fit Avro {ordering_type}: {exc}") from exc
    return keys.cast(pa.string()), parts.cast(pa.string()), ordering


def _varint(value: int) -> bytes:
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def encode_delete_content(
    records: Sequence[DeleteRecord] | pa.Table, ordering_type: str | None
) -> bytes:
    """The content of a delete block (version 3): see :func:`encode_delete_block`."""
    if ordering_type is not None and ordering_type not in _ORDERING_BRANCH:
        raise ValueError(
            f"unsupported ordering_type {ordering_type!r}; use one of {sorted(_ORDERING_BRANCH)}"
        )
    keys, parts, ordering = _delete_table(records, ordering_type)
    n = len(keys)
    # The orderingVal union is written as two plain fields with the same bytes: the branch as an
    # Avro int, then the value. A natural-order row is IntWrapper(0): branch 2, then varint 0,
    # which is also what 0 / False / "" / b"" encode to in every non-floating type.
    if ordering is None or ordering_type is None:
        value_type, branch, values = (
            "int",
            np.full(n, _NATURAL_BRANCH, np.int32),
            pa.nulls(n, pa.int32()),
        )
    else:
        value_type = _VALUE_TYPE[ordering_type]
        natural = ordering.is_null().to_numpy(zero_copy_only=False)
        branch = np.where(natural, _NATURAL_BRANCH, _ORDERING_BRANCH[ordering_type]).astype(
            np.int32
        )
        values = ordering
    if value_type in ("float", "double") and values.null_count:
        items = _encode_delete_items_slow(keys, parts, branch, values)
    else:
        zero = pa.scalar(_ORDERING_ZERO[value_type], _ORDERING_ARROW[value_type])
        table = pa.table(
            {
                "recordKey": keys,
                "partitionPath": parts,
                "branch": branch,
                "value": values.fill_null(zero),
            }
        )
        schema = {
            "type": "record",
            "name": "HoodieDeleteRecordBytes",
            "fields": [
                {"name": "recordKey", "type": ["null", "string"]},
                {"name": "partitionPath", "type": ["null", "string"]},
                {"name": "branch", "type": "int"},
                {"name": "value", "type": value_type},
            ],
        }
        data, _ = encode_records(table, schema)
        items = data.to_pybytes()
    avro = (_varint(n) + items + b"\x00") if n else b"\x00"
    return I32_PAIR.pack(DELETE_BLOCK_VERSION, len(avro)) + avro


def _encode_delete_items_slow(
    keys: pa.Array, parts: pa.Array, branch: np.ndarray, values: pa.Array
) -> bytes:
    """Per-record encoding for floating ordering values mixed with natural-order rows."""
    fmt = "<f" if values.type == pa.float32() else "<d"
    out = bytearray()
    for key, part, b, value in zip(
        keys.to_pylist(), parts.to_pylist(), branch.tolist(), values.to_pylist(), strict=True
    ):
        for text in (key, part):
            raw = text.encode("utf-8")
            out += b"\x02" + _varint(len(raw)) + raw
        out += _varint(b)
        out += b"\x00" if value is None else struct.pack(fmt, value)
    return bytes(out)


def encode_delete_block(
    records: Sequence[DeleteRecord] | pa.Table,
    instant_time: str,
    ordering_type: str | None,
    avro_schema: Mapping[str, Any] | str | None = None,
) -> bytes:
    """A framed delete block (content version 3) for ``records``.

    ``ordering_type`` is the ordering kind of the table's ordering field
    (:func:`ordering_kind`: ``"int"``, ``"long"``, ``"float"``, ``"double"``, ``"string"``,
    ``"bytes"``, ``"boolean"``, ``"decimal"``; also ``"date"``, ``"time-micros"`` and
    ``"timestamp-micros"`` for the semantic wrappers) or None for a table without one. Each
    ordering value is written in the ``orderingVal`` wrapper branch of that kind (``long`` ->
    ``LongWrapper``, branch 3). A None ordering value is written as ``IntWrapper(0)`` (bytes
    ``04 00``), exactly what Java's Spark ``DELETE`` writes: both Java and hudi-rs read it as
    *natural order* (see :mod:`engine.merge.record_merger`). (``LongWrapper(0)`` would not do
    that: hudi-rs compares it with the record's ordering value and keeps any record with
    ts > 0.) With
    ``ordering_type`` None every record is natural order and ordering values are refused.

    hudi-rs 0.5.0 refuses a block whose records use different branches ("Delete block mixes
    ordering types"), so natural-order and ordered deletes belong in separate blocks (the
    write handle writes them so).

    ``records`` may also be a table with ``_hoodie_record_key``, ``_hoodie_partition_path`` and
    optionally ``ordering``. ``avro_schema``, if given, goes to the ``SCHEMA`` header as Spark
    writes it; readers do not need it.
    """
    header = {HeaderKey.INSTANT_TIME: instant_time}
    if avro_schema is not None:
        header[HeaderKey.SCHEMA] = schema_json(avro_schema)
    return frame_parts(
        BlockType.DELETE, header, [encode_delete_content(records, ordering_type)], None
    )


class _AvroReader:
    """Just enough Avro binary decoding for HoodieDeleteRecordList."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def long(self) -> int:
        shift = result = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 63:
                raise LogFormatError("malformed varint in delete block")

    def raw(self) -> bytes:
        length = self.long()
        if length < 0 or self.pos + length > len(self.data):
            raise LogFormatError("bytes run past the delete block")
        self.pos += length
        return self.data[self.pos - length : self.pos]

    def fixed(self, fmt: struct.Struct) -> Any:
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return value

    def boolean(self) -> bool:
        byte = self.data[self.pos]
        self.pos += 1
        return byte != 0

    def optional_string(self) -> str | None:
        branch = self.long()
        if branch not in (0, 1):
            raise LogFormatError(f"bad union index {branch} in delete record")
        return None if branch == 0 else self.raw().decode("utf-8")

    def ordering(self) -> object | None:
        """One ``orderingVal``: the wrapped value, None for null and natural order."""
        branch = self.long()
        if branch == 0:
            return None
        if branch in _INTEGRAL_BRANCHES:  # int, long, date, time-micros, timestamp-micros
            value = self.long()
            return None if branch == _NATURAL_BRANCH and value == 0 else value
        if branch == 1:
            return self.boolean()
        if branch == 4:
            return self.fixed(_F32)
        if branch == 5:
            return self.fixed(_F64)
        if branch == 6:
            return self.raw()
        if branch == 7:
            return self.raw().decode("utf-8")
        if branch == 9:  # DecimalWrapper: decimal(30, 15) as unscaled two's complement
            return Decimal(int.from_bytes(self.raw(), "big", signed=True)).scaleb(-15)
        raise LogFormatError(
            f"orderingVal branch {branch} (multiple ordering fields?) is not supported"
        )


def decode_delete_block(block: LogBlock) -> list[DeleteRecord]:
    """The records of a delete block (content version 3), in file order.

    ``IntWrapper(0)`` and a null ``orderingVal`` decode to ``ordering_value=None`` (natural
    order; see :func:`encode_delete_block`); a null partition path decodes to ``""``. Versions 1
    and 2 (Java Kryo) raise LogFormatError.
    """
    if block.block_type is not BlockType.DELETE:
        raise ValueError(f"not a delete block: {block.block_type.name}")
    content = block.content
    if len(content) < 8:
        raise LogFormatError("delete block content is shorter than its 8-byte head")
    version, length = I32_PAIR.unpack_from(content, 0)
    if version != DELETE_BLOCK_VERSION:
        raise LogFormatError(f"delete block version {version} (Kryo) is not supported")
    if length != len(content) - 8:
        raise LogFormatError(f"delete block says {length} Avro bytes, has {len(content) - 8}")
    reader = _AvroReader(content[8:])
    out: list[DeleteRecord] = []
    try:
        while (count := reader.long()) != 0:
            if count < 0:  # a block with its byte size
                count = -count
                reader.long()
            for _ in range(count):
                key = reader.optional_string()
                part = reader.optional_string()
                if key is None:
                    raise LogFormatError("delete record without a record key")
                out.append(DeleteRecord(key, part or "", reader.ordering()))
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise LogFormatError(f"delete block Avro data is malformed: {exc}") from None
    if reader.pos != len(reader.data):
        raise LogFormatError("trailing bytes after the delete record list")
    return out
