"""Avro schema <-> Arrow schema conversion, Spark/Hudi style.

Hudi log blocks carry the Avro schema of their records in the ``SCHEMA`` header; Spark writers
make every field ``["null", T]`` with ``"default": null``. This module maps those schemas to
Arrow and back. It is pure (no I/O) and shared by the log block codec and the record codec.

Arrow -> Avro (:func:`arrow_schema_to_avro`):

=========================================  ==========================================
Arrow                                      Avro (always wrapped in ``["null", T]``)
=========================================  ==========================================
string, large_string, string_view          ``"string"``
binary, large_binary, binary_view, fixed   ``"bytes"``
int64, uint32, uint64                      ``"long"``
int32, int16, int8, uint16, uint8          ``"int"``
float64 / float32, float16                 ``"double"`` / ``"float"``
bool                                       ``"boolean"``
date32, date64                             ``{"type": "int", "logicalType": "date"}``
timestamp[s|ms]                            ``{"type": "long", "logicalType": "timestamp-millis"}``
timestamp[us|ns]                           ``{"type": "long", "logicalType": "timestamp-micros"}``
time32 / time64                            ``time-millis`` int / ``time-micros`` long
decimal128 / decimal256 (p, s)             ``{"type": "bytes", "logicalType": "decimal", ...}``
list, large_list, fixed_size_list          ``{"type": "array", "items": ["null", T]}``
struct                                     nested ``record`` named after the field
map (string keys)                          ``{"type": "map", "values": ["null", T]}``
dictionary                                 its value type
=========================================  ==========================================

Timestamps without a time zone are treated as UTC instants (Spark's ``TimestampType``; writers
store them as ``timestamp[unit, tz=UTC]``, see :mod:`engine.format.timestamps`); Avro
``timestamp-*`` comes back as ``timestamp[unit, tz=UTC]``, ``local-timestamp-*`` (a table Java
wrote from Spark's ``TimestampNTZType``) without a zone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "FlatField",
    "Kind",
    "arrow_schema_to_avro",
    "avro_schema_to_arrow",
    "flat_fields",
    "primitive_name",
    "unwrap_nullable",
]

AvroSchema = Any
"""An Avro schema in its JSON form: a type name, a dict, or a list (a union)."""

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})

PRIMITIVE_TO_ARROW: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def unwrap_nullable(schema: AvroSchema) -> tuple[AvroSchema, bool]:
    """Return ``(T, True)`` for a ``["null", T]`` / ``[T, "null"]`` union, else ``(schema, False)``.

    Raises ValueError for a union with more than one non-null branch, which has no Arrow
    equivalent that Hudi readers produce.
    """
    if not isinstance(schema, list):
        return schema, False
    non_null = [branch for branch in schema if branch != "null"]
    if len(non_null) == 1 and len(schema) == 2:
        return non_null[0], True
    if not non_null:
        return "null", True
    raise ValueError(f"unsupported Avro union {schema!r}: only null plus one type is supported")


def primitive_name(schema: AvroSchema) -> str | None:
    """The Avro primitive name of ``schema`` (``{"type": "long", ...}`` -> ``"long"``), if any."""
    if isinstance(schema, str):
        return schema if schema in PRIMITIVES else None
    if isinstance(schema, Mapping):
        inner = schema.get("type")
        if isinstance(inner, str) and inner in PRIMITIVES:
            return inner
    return None


class _Names:
    """Named Avro types seen so far, for resolving references such as ``"ns.Name"``."""

    def __init__(self) -> None:
        self.types: dict[str, pa.DataType] = {}

    def register(self, schema: Mapping[str, Any], namespace: str, arrow_type: pa.DataType) -> str:
        name = str(schema["name"])
        ns = str(schema.get("namespace", namespace) or "")
        full = name if "." in name or not ns else f"{ns}.{name}"
        self.types[full] = arrow_type
        return full.rpartition(".")[0]

    def lookup(self, name: str, namespace: str) -> pa.DataType:
        for candidate in (name, f"{namespace}.{name}" if namespace else name):
            if candidate in self.types:
                return self.types[candidate]
        raise ValueError(f"unknown Avro type name {name!r}")


def _logical_to_arrow(schema: Mapping[str, Any]) -> pa.DataType | None:
    logical = schema.get("logicalType")
    base = schema.get("type")
    if logical == "decimal" and base in ("bytes", "fixed"):
        precision = int(schema["precision"])
        scale = int(schema.get("scale", 0))
        return (
            pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
        )
    table: dict[tuple[str, str], pa.DataType] = {
        ("date", "int"): pa.date32(),
        ("time-millis", "int"): pa.time32("ms"),
        ("time-micros", "long"): pa.time64("us"),
        ("timestamp-millis", "long"): pa.timestamp("ms", tz="UTC"),
        ("timestamp-micros", "long"): pa.timestamp("us", tz="UTC"),
        ("timestamp-nanos", "long"): pa.timestamp("ns", tz="UTC"),
        ("local-timestamp-millis", "long"): pa.timestamp("ms"),
        ("local-timestamp-micros", "long"): pa.timestamp("us"),
        ("local-timestamp-nanos", "long"): pa.timestamp("ns"),
    }
    if isinstance(logical, str) and isinstance(base, str):
        return table.get((logical, base))
    return None


def _to_arrow_type(schema: AvroSchema, names: _Names, namespace: str) -> tuple[pa.DataType, bool]:
    """Arrow type and nullability of one Avro type."""
    inner, nullable = unwrap_nullable(schema)
    if isinstance(inner, list):  # pragma: no cover - unwrap_nullable already rejected it
        raise ValueError(f"unsupported Avro union {inner!r}")
    if isinstance(inner, str):
        if inner in PRIMITIVE_TO_ARROW:
            return PRIMITIVE_TO_ARROW[inner], nullable or inner == "null"
        return names.lookup(inner, namespace), nullable
    if not isinstance(inner, Mapping):
        raise ValueError(f"not an Avro schema: {inner!r}")
    kind = inner.get("type")
    logical = _logical_to_arrow(inner)
    if logical is not None:
        if kind == "fixed":
            names.register(inner, namespace, logical)
        return logical, nullable
    if kind == "record":
        record_type = pa.struct([])
        child_ns = names.register(inner, namespace, record_type)
        fields = [_to_arrow_field(f, names, child_ns) for f in inner.get("fields", [])]
        record_type = pa.struct(fields)
        names.register(inner, namespace, record_type)
        return record_type, nullable
    if kind == "enum":
        names.register(inner, namespace, pa.string())
        return pa.string(), nullable
    if kind == "fixed":
        fixed_type = pa.binary(int(inner["size"]))
        names.register(inner, namespace, fixed_type)
        return fixed_type, nullable
    if kind == "array":
        item_type, item_nullable = _to_arrow_type(inner["items"], names, namespace)
        return pa.list_(pa.field("element", item_type, nullable=item_nullable)), nullable
    if kind == "map":
        value_type, value_nullable = _to_arrow_type(inner["values"], names, namespace)
        value_field = pa.field("value", value_type, nullable=value_nullable)
        return pa.map_(pa.field("key", pa.string(), nullable=False), value_field), nullable
    if isinstance(kind, (str, list, Mapping)):
        # {"type": "long"} with an unknown or absent logical type, or {"type": {...}}
        return _to_arrow_type(kind, names, namespace)[0], nullable
    raise ValueError(f"not an Avro schema: {inner!r}")


def _to_arrow_field(field: Mapping[str, Any], names: _Names, namespace: str) -> pa.Field:
    arrow_type, nullable = _to_arrow_type(field["type"], names, namespace)
    return pa.field(str(field["name"]), arrow_type, nullable=nullable)


def avro_schema_to_arrow(schema: Mapping[str, Any]) -> pa.Schema:
    """Convert an Avro ``record`` schema (a parsed JSON dict) to an Arrow schema.

    Fields are nullable exactly when their Avro type is a union with ``"null"``. Logical types
    map as in the module table; enums become strings, ``fixed`` becomes ``binary(size)``.
    Raises ValueError for a non-record schema or a union of several non-null types.
    """
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        raise ValueError("an Avro record schema is required at the top level")
    names = _Names()
    struct_type, _ = _to_arrow_type(schema, names, str(schema.get("namespace", "") or ""))
    return pa.schema(list(struct_type))


def _null_wrapped(avro_type: AvroSchema) -> list[AvroSchema]:
    return ["null", avro_type]


def _to_avro_type(arrow_type: pa.DataType, name: str, namespace: str) -> AvroSchema:
    """Avro type (not null-wrapped) for one Arrow type; ``name``/``namespace`` name records."""
    t = pa.types
    if t.is_dictionary(arrow_type):
        return _to_avro_type(arrow_type.value_type, name, namespace)
    if t.is_string(arrow_type) or t.is_large_string(arrow_type) or t.is_string_view(arrow_type):
        return "string"
    if t.is_boolean(arrow_type):
        return "boolean"
    if t.is_int64(arrow_type) or t.is_uint32(arrow_type) or t.is_uint64(arrow_type):
        return "long"
    if t.is_integer(arrow_type):
        return "int"
    if t.is_float64(arrow_type):
        return "double"
    if t.is_floating(arrow_type):
        return "float"
    if t.is_date(arrow_type):
        return {"type": "int", "logicalType": "date"}
    if t.is_timestamp(arrow_type):
        millis = arrow_type.unit in ("s", "ms")
        return {"type": "long", "logicalType": "timestamp-millis" if millis else "timestamp-micros"}
    if t.is_time32(arrow_type):
        return {"type": "int", "logicalType": "time-millis"}
    if t.is_time64(arrow_type):
        return {"type": "long", "logicalType": "time-micros"}
    if t.is_decimal(arrow_type):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": arrow_type.precision,
            "scale": arrow_type.scale,
        }
    if (
        t.is_binary(arrow_type)
        or t.is_large_binary(arrow_type)
        or t.is_fixed_size_binary(arrow_type)
        or t.is_binary_view(arrow_type)
    ):
        return "bytes"
    if t.is_map(arrow_type):
        key_type = arrow_type.key_type
        if not (t.is_string(key_type) or t.is_large_string(key_type)):
            raise ValueError(f"field {name!r}: Avro map keys must be strings, not {key_type}")
        values = _field_type(arrow_type.item_field, name, namespace)
        return {"type": "map", "values": values}
    if t.is_list(arrow_type) or t.is_large_list(arrow_type) or t.is_fixed_size_list(arrow_type):
        items = _field_type(arrow_type.value_field, name, namespace)
        return {"type": "array", "items": items}
    if t.is_struct(arrow_type):
        child_ns = f"{namespace}.{name}" if namespace else name
        fields = [
            {"name": f.name, "type": _record_field_type(f, child_ns), "default": None}
            for f in arrow_type
        ]
        return {"type": "record", "name": name, "namespace": namespace, "fields": fields}
    raise ValueError(f"field {name!r}: no Avro type for Arrow type {arrow_type}")


def _field_type(field: pa.Field, name: str, namespace: str) -> AvroSchema:
    if pa.types.is_null(field.type):
        return "null"
    avro_type = _to_avro_type(field.type, name, namespace)
    return _null_wrapped(avro_type) if field.nullable else avro_type


def _record_field_type(field: pa.Field, namespace: str) -> AvroSchema:
    """Record fields are always ``["null", T]`` (Spark/Hudi style), whatever the Arrow flag."""
    if pa.types.is_null(field.type):
        return "null"
    return _null_wrapped(_to_avro_type(field.type, field.name, namespace))


def arrow_schema_to_avro(schema: pa.Schema, name: str, namespace: str) -> dict[str, Any]:
    """Convert an Arrow schema to a Spark/Hudi-style Avro record schema (a JSON-ready dict).

    Every record field becomes ``["null", T]`` with ``"default": null``, as Spark/Hudi write
    them (a non-nullable Arrow flag is not kept); array items and map values are null-wrapped
    when their Arrow item field is nullable. A ``null``-typed column becomes ``"null"``.
    Nested structs become records named after their field, in the namespace
    ``<parent namespace>.<parent name>``, so full names stay unique. Raises ValueError for a
    type Avro cannot hold (e.g. a map with non-string keys).
    """
    record = _to_avro_type(pa.struct(list(schema)), name, namespace)
    return dict(record)


# --------------------------------------------------------------------------------------------
# Flat records: what the vectorized codec (engine.format.avro_encode / .avro_decode) handles
# --------------------------------------------------------------------------------------------


class Kind(enum.Enum):
    """Avro primitive encodings the vectorized codec handles."""

    NULL = "null"
    BOOLEAN = "boolean"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    BYTES = "bytes"
    STRING = "string"


@dataclass(frozen=True)
class FlatField:
    """One field of a flat record schema, as the vectorized codec sees it.

    ``null_branch`` / ``value_branch`` are the union indexes of ``null`` and of the value type
    (both None when the field is not a union).
    """

    name: str
    kind: Kind
    arrow_type: pa.DataType
    null_branch: int | None
    value_branch: int | None


def _flat_kind(schema: Any) -> Kind | None:
    prim = primitive_name(schema)
    if prim is None:
        return None
    if isinstance(schema, Mapping) and schema.get("logicalType") == "decimal":
        return None  # unscaled two's complement bytes: left to fastavro
    return Kind(prim)


def flat_fields(avro_schema: Mapping[str, Any]) -> list[FlatField] | None:
    """Describe a record schema for the vectorized codec, or None when it is not flat."""
    arrow_schema = avro_schema_to_arrow(avro_schema)
    out: list[FlatField] = []
    for field, arrow_field in zip(avro_schema["fields"], arrow_schema, strict=True):
        avro_type = field["type"]
        null_branch: int | None = None
        value_branch: int | None = None
        if isinstance(avro_type, list):
            non_null = [i for i, branch in enumerate(avro_type) if branch != "null"]
            nulls = [i for i, branch in enumerate(avro_type) if branch == "null"]
            if len(non_null) > 1 or len(nulls) > 1:
                return None
            null_branch = nulls[0] if nulls else None
            value_branch = non_null[0] if non_null else None
            avro_type = avro_type[value_branch] if value_branch is not None else "null"
        kind = _flat_kind(avro_type)
        if kind is None:
            return None
        out.append(FlatField(str(field["name"]), kind, arrow_field.type, null_branch, value_branch))
    return out
