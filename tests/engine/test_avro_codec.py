"""Avro records <-> Arrow: the vectorized codec against fastavro, the reference encoder."""

from __future__ import annotations

import datetime as dt
import io
import math
from decimal import Decimal
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.format.avro_codec import (
    arrow_schema_to_avro,
    arrow_to_avro_payloads,
    avro_payloads_to_arrow,
    avro_schema_to_arrow,
    decode_records,
    encode_records,
    flat_fields,
)
from tests.soak import soak


def fastavro_payloads(rows: list[dict[str, Any]], schema: dict[str, Any]) -> list[bytes]:
    """The reference: one fastavro schemaless record per row."""
    parsed = fastavro.parse_schema(schema)
    out = []
    for row in rows:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
        out.append(buf.getvalue())
    return out


def split(data: bytes, offsets: np.ndarray) -> list[bytes]:
    return [data[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def record(fields: list[tuple[str, Any]]) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "r",
        "namespace": "n",
        "fields": [{"name": name, "type": t} for name, t in fields],
    }


# ------------------------------------------------------------------------------------------
# Flat records: vectorized path
# ------------------------------------------------------------------------------------------

FLAT_TYPES: dict[str, tuple[Any, pa.DataType, st.SearchStrategy[Any]]] = {
    "boolean": ("boolean", pa.bool_(), st.booleans()),
    "int": ("int", pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "long": ("long", pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float": ("float", pa.float32(), st.floats(width=32, allow_nan=False)),
    "double": ("double", pa.float64(), st.floats(allow_nan=False)),
    "string": ("string", pa.string(), st.text(max_size=40)),
    "bytes": ("bytes", pa.binary(), st.binary(max_size=40)),
    "date": (
        {"type": "int", "logicalType": "date"},
        pa.date32(),
        st.dates(min_value=dt.date(1, 1, 1)),
    ),
    "timestamp": (
        {"type": "long", "logicalType": "timestamp-micros"},
        pa.timestamp("us", tz="UTC"),
        st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999),  # datetime's range
    ),
}


@st.composite
def flat_tables(draw: st.DrawFn) -> tuple[pa.Table, dict[str, Any]]:
    """A random flat table and its Avro schema (unions either way round, or no union)."""
    n = draw(st.integers(0, 40))
    names = draw(st.lists(st.sampled_from(sorted(FLAT_TYPES)), min_size=1, max_size=8))
    fields: list[tuple[str, Any]] = []
    columns: dict[str, pa.Array] = {}
    for i, kind in enumerate(names):
        avro_type, arrow_type, values = FLAT_TYPES[kind]
        shape = draw(st.sampled_from(["null_first", "null_last", "plain"]))
        nullable = shape != "plain"
        cells = draw(st.lists(st.none() | values if nullable else values, min_size=n, max_size=n))
        if kind == "timestamp":
            column = pa.array(cells, pa.int64()).cast(arrow_type)
        else:
            column = pa.array(cells, arrow_type)
        name = f"c{i}_{kind}"
        union = {"null_first": ["null", avro_type], "null_last": [avro_type, "null"]}
        fields.append((name, union.get(shape, avro_type)))
        columns[name] = column
    return pa.table(columns), record(fields)


@settings(max_examples=soak(60, 600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flat_tables())
def test_arrow_to_avro_payloads_random_flat_tables_round_trip_and_match_fastavro(
    case: tuple[pa.Table, dict[str, Any]],
) -> None:
    table, schema = case
    assert flat_fields(schema) is not None
    data, offsets = arrow_to_avro_payloads(table, schema)
    assert offsets[0] == 0 and offsets[-1] == len(data) and len(offsets) == table.num_rows + 1
    assert split(data, offsets) == fastavro_payloads(table.to_pylist(), schema)
    back = avro_payloads_to_arrow(data, offsets, schema)
    assert back.schema == avro_schema_to_arrow(schema)
    assert back.cast(table.schema).equals(table)


@settings(max_examples=soak(25, 250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(max_size=30) | st.none(), min_size=1, max_size=30), st.integers(0, 7))
def test_avro_payloads_to_arrow_unaligned_buffer_equal(texts: list[str | None], shift: int) -> None:
    table = pa.table({"s": pa.array(texts, pa.string()), "n": list(range(len(texts)))})
    schema = arrow_schema_to_avro(table.schema, "r", "n")
    data, offsets = arrow_to_avro_payloads(table, schema)
    padded = pa.py_buffer(b"\x00" * shift + data + b"\xff" * shift)
    back = decode_records(padded, offsets[:-1] + shift, offsets[1:] + shift, schema)
    assert back.equals(table)


def test_arrow_to_avro_payloads_benchmark_shape_matches_fastavro() -> None:
    rng = np.random.default_rng(7)
    n = 3000
    columns: dict[str, Any] = {
        "_hoodie_commit_time": ["20251220210108078"] * n,
        "_hoodie_commit_seqno": [f"20251220210108078_0_{i}" for i in range(n)],
        "_hoodie_record_key": [f"key-{i:08d}" for i in range(n)],
        "_hoodie_partition_path": [f"dt=2024-01-{i % 28 + 1:02d}" for i in range(n)],
        "_hoodie_file_name": ["6e1d5cc4-c487-487d-abbe-fe9b30b1c0cc-0"] * n,
        "ts": rng.integers(1_600_000_000_000, 1_700_000_000_000, n),
    }
    for j in range(4):
        columns[f"l{j}"] = rng.integers(-(10**12), 10**12, n)
        columns[f"d{j}"] = rng.random(n) * 1000
    columns["s0"] = [f"ünïcødé-{i}" * (i % 4) for i in range(n)]
    table = pa.table(columns)
    schema = arrow_schema_to_avro(table.schema, "r", "n")
    data, offsets = arrow_to_avro_payloads(table, schema)
    assert split(data, offsets) == fastavro_payloads(table.to_pylist(), schema)
    assert avro_payloads_to_arrow(data, offsets, schema).equals(table)


def test_avro_payloads_to_arrow_string_lengths_around_view_inline_limit() -> None:
    texts = ["x" * k for k in (0, 1, 7, 8, 9, 11, 12, 13, 16, 63, 64, 200, 9000)]
    table = pa.table({"s": texts})
    for schema in (record([("s", "string")]), record([("s", ["null", "string"])])):
        data, offsets = arrow_to_avro_payloads(table, schema)
        assert split(data, offsets) == fastavro_payloads(table.to_pylist(), schema)
        assert avro_payloads_to_arrow(data, offsets, schema).column("s").to_pylist() == texts


def test_avro_payloads_to_arrow_extreme_longs_nine_and_ten_byte_varints() -> None:
    values = [0, -1, 1, 2**55, -(2**55) - 1, 2**62, 2**63 - 1, -(2**63), None]
    table = pa.table({"v": pa.array(values, pa.int64())})
    schema = record([("v", ["null", "long"])])
    data, offsets = arrow_to_avro_payloads(table, schema)
    assert split(data, offsets) == fastavro_payloads(table.to_pylist(), schema)
    assert max(np.diff(offsets)) == 11  # union index + a 10-byte varint
    assert avro_payloads_to_arrow(data, offsets, schema).column("v").to_pylist() == values


def test_avro_payloads_to_arrow_nan_and_infinities_bytes_exact() -> None:
    table = pa.table({"d": [math.nan, math.inf, -math.inf, -0.0]})
    schema = record([("d", "double")])
    data, offsets = arrow_to_avro_payloads(table, schema)
    back = avro_payloads_to_arrow(data, offsets, schema).column("d").to_pylist()
    assert math.isnan(back[0]) and back[1:3] == [math.inf, -math.inf]
    assert math.copysign(1.0, back[3]) == -1.0


def test_avro_payloads_to_arrow_many_chunks_equal() -> None:
    n = 3000
    table = pa.table({"k": [f"{i:06d}" + "z" * 2000 for i in range(n)], "v": list(range(n))})
    schema = arrow_schema_to_avro(table.schema, "r", "n")
    data, offsets = arrow_to_avro_payloads(table, schema)
    back = avro_payloads_to_arrow(data, offsets, schema)
    assert back.column("k").num_chunks > 1  # decoded in ~2 MiB chunks
    assert back.equals(table)


def test_avro_payloads_to_arrow_empty_input_empty_table() -> None:
    schema = record([("s", ["null", "string"]), ("v", "long")])
    table = pa.table({"s": pa.array([], pa.string()), "v": pa.array([], pa.int64())})
    data, offsets = arrow_to_avro_payloads(table, schema)
    assert data == b"" and offsets.tolist() == [0]
    assert avro_payloads_to_arrow(data, offsets, schema).num_rows == 0


def test_avro_payloads_to_arrow_wrong_writer_schema_raises_value_error() -> None:
    table = pa.table({"s": ["abc", "de"], "v": [1, 2]})
    schema = arrow_schema_to_avro(table.schema, "r", "n")
    data, offsets = arrow_to_avro_payloads(table, schema)
    with pytest.raises(ValueError):
        avro_payloads_to_arrow(data, offsets, record([("s", ["null", "string"])]))
    with pytest.raises(ValueError):
        avro_payloads_to_arrow(data, offsets, record([("v", ["null", "long"])]))


def test_avro_payloads_to_arrow_invalid_utf8_raises_value_error() -> None:
    schema = record([("s", "string")])
    data = b"\x04\xff\xfe"
    with pytest.raises(ValueError, match="UTF-8"):
        avro_payloads_to_arrow(data, np.array([0, 3]), schema)


def test_arrow_to_avro_payloads_null_in_non_nullable_field_raises_value_error() -> None:
    table = pa.table({"v": pa.array([1, None], pa.int64())})
    with pytest.raises(ValueError, match="'v'"):
        arrow_to_avro_payloads(table, record([("v", "long")]))


def test_arrow_to_avro_payloads_int_overflow_raises_value_error() -> None:
    table = pa.table({"v": pa.array([2**40], pa.int64())})
    with pytest.raises(ValueError, match="'v'"):
        arrow_to_avro_payloads(table, record([("v", ["null", "int"])]))


def test_arrow_to_avro_payloads_missing_nullable_column_written_as_null() -> None:
    table = pa.table({"a": [1, 2]})
    schema = record([("a", "long"), ("b", ["null", "string"])])
    data, offsets = arrow_to_avro_payloads(table, schema)
    assert split(data, offsets) == [b"\x02\x00", b"\x04\x00"]


def test_encode_records_length_prefixed_big_endian_lengths() -> None:
    table = pa.table({"s": ["a", "bcd"]})
    schema = record([("s", "string")])
    data, offsets = encode_records(table, schema, length_prefixed=True)
    assert data.to_pybytes() == b"\x00\x00\x00\x02\x02a\x00\x00\x00\x04\x06bcd"
    assert offsets.tolist() == [0, 6, 14]


def test_decode_records_reader_schema_reorders_and_adds_columns() -> None:
    table = pa.table({"a": [1, 2], "b": ["x", "y"]})
    schema = arrow_schema_to_avro(table.schema, "r", "n")
    data, offsets = arrow_to_avro_payloads(table, schema)
    reader = pa.schema([("b", pa.large_string()), ("c", pa.float64()), ("a", pa.int64())])
    back = avro_payloads_to_arrow(data, offsets, schema, reader)
    assert back.schema == reader
    assert back.to_pylist() == [{"b": "x", "c": None, "a": 1}, {"b": "y", "c": None, "a": 2}]


# ------------------------------------------------------------------------------------------
# Everything else: fastavro path
# ------------------------------------------------------------------------------------------


def test_avro_payloads_to_arrow_nested_schema_round_trip_matches_fastavro() -> None:
    table = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "point": pa.array(
                [{"x": 1.0, "tags": ["a"]}, None, {"x": None, "tags": []}],
                pa.struct([("x", pa.float64()), ("tags", pa.list_(pa.string()))]),
            ),
            "attrs": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int32())),
            "price": pa.array([Decimal("1.50"), None, Decimal("-0.01")], pa.decimal128(12, 2)),
            "day": pa.array([dt.date(2024, 1, 2), None, dt.date(1969, 12, 31)], pa.date32()),
            "at": pa.array([0, None, 1_700_000_000_000_000], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )
    schema = arrow_schema_to_avro(table.schema, "r", "hoodie.t")
    assert flat_fields(schema) is None
    data, offsets = arrow_to_avro_payloads(table, schema)
    back = avro_payloads_to_arrow(data, offsets, schema, table.schema)
    assert back.equals(table)
    rows = fastavro_payloads(
        [
            {**r, "attrs": dict(r["attrs"]) if r["attrs"] is not None else None}
            for r in table.to_pylist()
        ],
        schema,
    )
    assert split(data, offsets) == rows


def test_avro_payloads_to_arrow_enum_and_fixed_fastavro_path() -> None:
    schema = record(
        [
            ("e", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}),
            ("f", ["null", {"type": "fixed", "name": "Four", "size": 4}]),
            ("u", {"type": "string", "logicalType": "uuid"}),
        ]
    )
    rows = [
        {"e": "GREEN", "f": b"abcd", "u": "6e1d5cc4-c487-487d-abbe-fe9b30b1c0cc"},
        {"e": "RED", "f": None, "u": "00000000-0000-0000-0000-000000000000"},
    ]
    payloads = fastavro_payloads(rows, schema)
    offsets = np.cumsum([0, *map(len, payloads)])
    back = avro_payloads_to_arrow(b"".join(payloads), offsets, schema)
    assert back.to_pylist() == rows
    assert back.schema.field("f").type == pa.binary(4)


# ------------------------------------------------------------------------------------------
# Schemas
# ------------------------------------------------------------------------------------------


def test_arrow_schema_to_avro_spark_style_types() -> None:
    schema = pa.schema(
        [
            ("s", pa.string()),
            ("i64", pa.int64()),
            ("i32", pa.int32()),
            ("i16", pa.int16()),
            ("i8", pa.int8()),
            ("f64", pa.float64()),
            ("f32", pa.float32()),
            ("b", pa.bool_()),
            ("bin", pa.binary()),
            ("d", pa.date32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("ts_ms", pa.timestamp("ms")),
            ("dec", pa.decimal128(10, 3)),
        ]
    )
    avro = arrow_schema_to_avro(schema, "t_record", "hoodie.t")
    assert (avro["type"], avro["name"], avro["namespace"]) == ("record", "t_record", "hoodie.t")
    types = {f["name"]: f["type"] for f in avro["fields"]}
    assert all(f["default"] is None and f["type"][0] == "null" for f in avro["fields"])
    assert {name: t[1] for name, t in types.items()} == {
        "s": "string",
        "i64": "long",
        "i32": "int",
        "i16": "int",
        "i8": "int",
        "f64": "double",
        "f32": "float",
        "b": "boolean",
        "bin": "bytes",
        "d": {"type": "int", "logicalType": "date"},
        "ts": {"type": "long", "logicalType": "timestamp-micros"},
        "ts_ms": {"type": "long", "logicalType": "timestamp-millis"},
        "dec": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3},
    }
    fastavro.parse_schema(avro)


def test_arrow_schema_to_avro_nested_record_names_unique() -> None:
    inner = pa.struct([("x", pa.int64())])
    schema = pa.schema(
        [
            ("a", pa.struct([("inner", inner)])),
            ("b", pa.struct([("inner", inner)])),
            ("l", pa.list_(pa.struct([("y", pa.string())]))),
            ("m", pa.map_(pa.string(), pa.struct([("z", pa.float64())]))),
        ]
    )
    avro = arrow_schema_to_avro(schema, "r", "ns")
    fastavro.parse_schema(avro)  # raises on a redefined name
    a_inner = avro["fields"][0]["type"][1]["fields"][0]["type"][1]
    b_inner = avro["fields"][1]["type"][1]["fields"][0]["type"][1]
    assert (a_inner["namespace"], a_inner["name"]) == ("ns.r.a", "inner")
    assert (b_inner["namespace"], b_inner["name"]) == ("ns.r.b", "inner")


def test_avro_schema_to_arrow_round_trip_equal() -> None:
    schema = pa.schema(
        [
            ("s", pa.string()),
            ("i", pa.int32()),
            ("l", pa.int64()),
            ("f", pa.float32()),
            ("d", pa.float64()),
            ("b", pa.bool_()),
            ("bin", pa.binary()),
            ("day", pa.date32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("ms", pa.timestamp("ms", tz="UTC")),
            ("dec", pa.decimal128(20, 4)),
            ("st", pa.struct([("x", pa.int64()), ("y", pa.list_(pa.string()))])),
            ("mp", pa.map_(pa.string(), pa.float64())),
        ]
    )
    back = avro_schema_to_arrow(arrow_schema_to_avro(schema, "r", "n"))
    assert back.names == schema.names
    for original, converted in zip(schema, back, strict=True):
        if pa.types.is_list(original.type):
            assert converted.type.value_type == original.type.value_type
        elif pa.types.is_struct(original.type):
            assert [f.name for f in converted.type] == [f.name for f in original.type]
            assert converted.type.field("x").type == pa.int64()
            assert converted.type.field("y").type.value_type == pa.string()
        elif pa.types.is_map(original.type):
            assert converted.type.item_type == pa.float64()
        else:
            assert converted.type == original.type, original.name
        assert converted.nullable


def test_avro_schema_to_arrow_hudi_meta_fields_and_non_null_types() -> None:
    schema = record(
        [
            ("_hoodie_commit_time", ["null", "string"]),
            ("ts", ["long", "null"]),
            ("id", "string"),
            ("local", {"type": "long", "logicalType": "local-timestamp-micros"}),
        ]
    )
    arrow = avro_schema_to_arrow(schema)
    assert arrow.field("_hoodie_commit_time").nullable
    assert arrow.field("ts").type == pa.int64() and arrow.field("ts").nullable
    assert not arrow.field("id").nullable
    assert arrow.field("local").type == pa.timestamp("us")


def test_avro_schema_to_arrow_multi_type_union_raises_value_error() -> None:
    with pytest.raises(ValueError, match="union"):
        avro_schema_to_arrow(record([("u", ["null", "string", "long"])]))
