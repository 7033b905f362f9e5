"""Decoders: Kafka value bytes -> Arrow, bad records carried as (index, reason)."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import pickle
import random
import re
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from ingest import ddl, decode
from ingest.ddl import parse_ddl, sql_type_name
from ingest.decode import AvroDecoder, DecodeResult, JsonDecoder

UTC = dt.timezone.utc


def _binary(values: list[bytes | None]) -> pa.Array:
    return pa.array(values, pa.binary())


def _check_partition(result: DecodeResult, n: int) -> None:
    """Every input row is either good or an error, exactly once, in ascending order."""
    bad = [i for i, _ in result.errors]
    assert sorted(bad) == bad
    assert list(result.good_index) == sorted(result.good_index)
    assert sorted([*bad, *result.good_index.tolist()]) == list(range(n))
    assert result.table.num_rows == len(result.good_index)


# --- DDL --------------------------------------------------------------------------------------


def test_parse_ddl_common_types_map_to_arrow() -> None:
    schema = parse_ddl(
        "id STRING, ts BIGINT NOT NULL, l LONG, i INT, i2 INTEGER, s SMALLINT, t TINYINT, "
        "d DOUBLE, f FLOAT, b BOOLEAN, day DATE, at TIMESTAMP, ntz TIMESTAMP_NTZ, "
        "amount DECIMAL(12, 3), raw BINARY, tags ARRAY<STRING>, m MAP<STRING, BIGINT>, "
        "nested STRUCT<a: INT, b ARRAY<DOUBLE>> COMMENT 'a struct', v VARCHAR(10)"
    )
    expected = {
        "id": pa.string(), "ts": pa.int64(), "l": pa.int64(), "i": pa.int32(),
        "i2": pa.int32(), "s": pa.int16(), "t": pa.int8(), "d": pa.float64(),
        "f": pa.float32(), "b": pa.bool_(), "day": pa.date32(),
        "at": pa.timestamp("us", tz="UTC"), "ntz": pa.timestamp("us"),
        "amount": pa.decimal128(12, 3), "raw": pa.binary(), "tags": pa.list_(pa.string()),
        "m": pa.map_(pa.string(), pa.int64()),
        "nested": pa.struct([("a", pa.int32()), ("b", pa.list_(pa.float64()))]),
        "v": pa.string(),
    }
    assert {f.name: f.type for f in schema} == expected
    assert not schema.field("ts").nullable
    assert schema.field("id").nullable


def test_parse_ddl_struct_wrapper_backquotes_and_case_are_accepted() -> None:
    schema = parse_ddl("struct<`weird name`: string, `a``b` decimal, x bigint>")
    assert schema.names == ["weird name", "a`b", "x"]
    assert schema.field("a`b").type == pa.decimal128(10, 0)


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("id STRNG", "unknown type 'STRNG'"),
        ("id", "expected more"),
        ("id STRING,", "expected more"),
        ("a INT, a INT", "duplicate field 'a'"),
        ("x DECIMAL(50,2)", "bad DECIMAL(50,2)"),
        ("x ARRAY<INT", "expected '>', got 'end of text'"),
        ("x INT y", "expected ',', got 'y'"),
        ("", "no fields"),
        ("x INT; drop", "unexpected character ';'"),
    ],
)
def test_parse_ddl_bad_schema_raises_value_error_naming_problem(ddl: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_ddl(ddl)


def test_sql_type_name_nested_types_read_like_ddl() -> None:
    ddl = "m MAP<STRING, ARRAY<DECIMAL(5,2)>>"
    assert sql_type_name(parse_ddl(ddl).field("m").type) == "MAP<STRING, ARRAY<DECIMAL(5,2)>>"


def test_decode_module_reexports_ddl_names_unchanged() -> None:
    """``from ingest.decode import parse_ddl, sql_type_name`` keeps working after the split."""
    assert decode.parse_ddl is ddl.parse_ddl
    assert decode.sql_type_name is ddl.sql_type_name
    assert {"parse_ddl", "sql_type_name"} <= set(decode.__all__)


# --- JSON -------------------------------------------------------------------------------------

DDL = ("id STRING, ts BIGINT, amount DOUBLE, tags ARRAY<STRING>, day DATE, raw BINARY, "
       "price DECIMAL(6,2), at TIMESTAMP")


def test_json_decoder_good_records_decode_all_types() -> None:
    value = {"id": "a", "ts": 1, "amount": 2.5, "tags": ["x", "y"], "day": "2024-01-02",
             "raw": "aGk=", "price": "1.25", "at": "2024-01-02T03:04:05+02:00", "extra": 1}
    result = JsonDecoder(DDL).decode(_binary([json.dumps(value).encode(), b'{"id": "b"}']))
    assert result.errors == []
    assert result.good_index.tolist() == [0, 1]
    assert result.table.schema == parse_ddl(DDL)
    first, second = result.table.to_pylist()
    assert first == {"id": "a", "ts": 1, "amount": 2.5, "tags": ["x", "y"],
                     "day": dt.date(2024, 1, 2), "raw": b"hi", "price": decimal.Decimal("1.25"),
                     "at": dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=UTC)}
    assert second == {"id": "b", "ts": None, "amount": None, "tags": None, "day": None,
                      "raw": None, "price": None, "at": None}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "null value"),
        (b"", "empty value"),
        (b"  \n ", "empty value"),
        (b'{"id":"b" "ts":2}', "invalid JSON at char 10: Expecting ',' delimiter"),
        (b'{"id":"c","ts":"abc"}', "field 'ts': expected BIGINT, got 'abc'"),
        (b'{"ts": 1.5}', "field 'ts': expected BIGINT, got 1.5"),
        (b'{"ts": 9223372036854775808}', "field 'ts': expected BIGINT, got 9223372036854775808"),
        (b'{"amount": true}', "field 'amount': expected DOUBLE, got true"),
        (b'{"tags": ["x", 5]}', "field 'tags[1]': expected STRING, got 5"),
        (b'{"day": "2024-13-01"}', "field 'day': expected DATE, got '2024-13-01'"),
        (b'{"raw": "!!"}', "field 'raw': expected BINARY, got '!!'"),
        (b'{"price": 1.255}', "field 'price': expected DECIMAL(6,2), got 1.255"),
        (b'{"at": "yesterday"}', "field 'at': expected TIMESTAMP, got 'yesterday'"),
        (b"[1, 2]", "expected a JSON object, got array"),
        (b"null", "expected a JSON object, got null"),
        (b"42", "expected a JSON object, got number"),
        (b'\xff{"id": "x"}', "invalid UTF-8 at byte 0"),
        (b'{"id": "\xff"}', "invalid UTF-8 at byte 8"),
        (b'{"id": "a"}{"id": "b"}', "invalid JSON at char 11: Extra data"),
        (b'{"id": "raw\nnewline"}', "invalid JSON at char 11: Invalid control character at"),
    ],
)
def test_json_decoder_bad_record_gives_specific_reason(value: bytes | None, reason: str) -> None:
    good = b'{"id": "ok", "ts": 7}'
    result = JsonDecoder(DDL).decode(_binary([good, value, good]))
    assert result.errors == [(1, reason)]
    assert result.good_index.tolist() == [0, 2]
    assert result.table.column("ts").to_pylist() == [7, 7]


def test_json_decoder_unicode_and_escapes_round_trip() -> None:
    texts = ["é😀", "日本語", "\u0000nul", 'quote " and \\ backslash', "tab\tand\nnewline"]
    values = [json.dumps({"id": t}, ensure_ascii=ascii_only).encode()
              for t in texts for ascii_only in (True, False)]
    values.append(b'{"id": "pretty"\n}')  # newlines between tokens are white space
    result = JsonDecoder("id STRING").decode(_binary(values))
    assert result.errors == []
    assert result.table.column("id").to_pylist() == [t for t in texts for _ in (0, 1)] + [
        "pretty"]


def test_json_decoder_not_null_field_missing_is_error() -> None:
    result = JsonDecoder("id STRING NOT NULL, n INT").decode(
        _binary([b'{"id": "a"}', b'{"n": 1}', b'{"id": null}']))
    assert result.errors == [(1, "field 'id': missing or null"), (2, "field 'id': missing or null")]
    assert result.table.schema.field("id").nullable is False


def test_json_decoder_map_schema_decodes_record_by_record() -> None:
    decoder = JsonDecoder("m MAP<STRING, INT>, d STRUCT<when: DATE>")
    result = decoder.decode(_binary([
        b'{"m": {"a": 1, "b": null}, "d": {"when": "2024-02-03"}}',
        b'{"m": {"a": "x"}}',
        b'{"d": {"when": 5}}',
    ]))
    assert result.errors == [(1, "field 'm.a': expected INT, got 'x'"),
                             (2, "field 'd.when': expected DATE, got 5")]
    assert result.table.to_pylist() == [
        {"m": [("a", 1), ("b", None)], "d": {"when": dt.date(2024, 2, 3)}}]


def test_json_decoder_map_with_int_keys_raises_value_error() -> None:
    with pytest.raises(ValueError, match="STRING keys"):
        JsonDecoder("m MAP<INT, STRING>")


def test_json_decoder_avro_schema_from_dict_path_and_text(tmp_path: Path) -> None:
    avsc = {"type": "record", "name": "E", "fields": [
        {"name": "id", "type": "string"}, {"name": "n", "type": ["null", "long"]}]}
    path = tmp_path / "e.avsc"
    path.write_text(json.dumps(avsc))
    for schema in (avsc, path, str(path), json.dumps(avsc)):
        decoder = JsonDecoder(schema)
        result = decoder.decode(_binary([b'{"id": "x", "n": 3}', b'{"n": 4}']))
        assert result.table.column("n").to_pylist() == [3]
        assert result.errors == [(1, "field 'id': missing or null")]


def test_json_decoder_sparse_errors_in_large_batch_found_exactly() -> None:
    n = 5000
    values: list[bytes | None] = [json.dumps({"id": f"r{i}", "ts": i}).encode() for i in range(n)]
    bad = {17: b'{"ts": "x"}', 1023: b"{", 1024: None, 4999: b'{"ts": 1e3}'}
    for i, value in bad.items():
        values[i] = value
    result = JsonDecoder("id STRING, ts BIGINT").decode(_binary(values).slice(0))
    assert [i for i, _ in result.errors] == sorted(bad)
    _check_partition(result, n)
    assert result.table.column("ts").to_pylist() == [i for i in range(n) if i not in bad]


def test_json_decoder_sliced_and_chunked_input_keeps_indexes() -> None:
    values = _binary([b'{"id": "skip"}', b'{"id": "a"}', b"oops", b'{"id": "b"}'])
    chunked = pa.chunked_array([values.slice(1, 2), values.slice(3)])
    result = JsonDecoder("id STRING").decode(chunked)
    assert result.good_index.tolist() == [0, 2]
    assert result.errors == [(1, "invalid JSON at char 0: Expecting value")]
    assert result.table.column("id").to_pylist() == ["a", "b"]


def test_json_decoder_record_fate_does_not_depend_on_neighbours() -> None:
    """Seeded random mutations: each value decodes in a batch exactly as it does alone."""
    decoder = JsonDecoder("id STRING, ts BIGINT, x DOUBLE, tags ARRAY<STRING>, "
                          "s STRUCT<a: INT, b: ARRAY<DOUBLE>>, day DATE, p DECIMAL(5,1)")
    seeds = [b'{"id":"a","ts":1,"x":2.5,"tags":["x"],"s":{"a":1,"b":[1.5,null]},'
             b'"day":"2024-01-02","p":"12.5"}', b"{}", b'{"id":null,"ts":-3}']
    alphabet = b'{}[]",:0123456789.eE+-truefalsenull \n\\u\x00\xff'
    rng = random.Random(20240601)
    for _ in range(60):
        values = []
        for _ in range(rng.randint(1, 40)):
            value = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(0, 3)):
                at = rng.randrange(1, max(2, len(value) - 1))
                if rng.random() < 0.5:
                    value[at:at] = bytes([rng.choice(alphabet)])
                elif len(value) > 2:
                    del value[at]
            values.append(bytes(value))
        result = decoder.decode(_binary(values))
        _check_partition(result, len(values))
        rows = dict(zip(result.good_index.tolist(), result.table.to_pylist(), strict=True))
        reasons = dict(result.errors)
        for i, value in enumerate(values):
            alone = decoder.decode(_binary([value]))
            if i in rows:
                assert alone.table.to_pylist() == [rows[i]], value
            else:
                assert alone.errors == [(0, reasons[i])], value


def test_json_decoder_pickled_decodes_the_same() -> None:
    decoder = JsonDecoder(DDL)
    decoder.decode(_binary([b'{"ts": "x"}']))  # builds the lazy checker
    clone = pickle.loads(pickle.dumps(decoder))
    values = _binary([b'{"ts": "x"}', b'{"ts": 3}'])
    assert clone.decode(values).errors == decoder.decode(values).errors


def test_decoders_empty_and_all_null_input_give_empty_tables() -> None:
    for decoder in (JsonDecoder("a INT"), AvroDecoder(_AVSC)):
        empty = decoder.decode(_binary([]))
        assert empty.table.num_rows == 0
        assert empty.table.schema == decoder.schema
        nulls = decoder.decode(_binary([None, None]))
        assert nulls.errors == [(0, "null value"), (1, "null value")]
        assert nulls.good_index.dtype == np.int64


# --- Avro -------------------------------------------------------------------------------------

_AVSC: dict[str, Any] = {
    "type": "record", "name": "Event", "namespace": "t", "fields": [
        {"name": "id", "type": "string"},
        {"name": "ts", "type": "long"},
        {"name": "amount", "type": ["null", "double"], "default": None},
        {"name": "note", "type": "string", "default": "none"},
    ]}


def _avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _confluent(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def test_avro_decoder_plain_records_decode() -> None:
    records = [{"id": f"é{i}", "ts": i, "amount": None if i % 2 else i / 2, "note": "n"}
               for i in range(2500)]
    result = AvroDecoder(_AVSC).decode(_binary([_avro(_AVSC, r) for r in records]))
    assert result.errors == []
    assert result.table.to_pylist() == records


def test_avro_decoder_truncated_and_oversized_records_are_errors() -> None:
    good = _avro(_AVSC, {"id": "a", "ts": 1, "amount": 1.0, "note": "x"})
    result = AvroDecoder(_AVSC).decode(_binary([good, good[:3], good + b"\x00\x00", None]))
    assert result.errors == [(1, "invalid Avro: the record ends early"),
                             (2, "invalid Avro: 2 bytes left after the record (wrong schema?)"),
                             (3, "null value")]
    assert result.good_index.tolist() == [0]


def test_avro_decoder_confluent_framing_reads_each_writer_schema() -> None:
    old = {"type": "record", "name": "Event", "namespace": "t", "fields": [
        {"name": "id", "type": "string"}, {"name": "ts", "type": "int"}]}
    decoder = AvroDecoder(_AVSC, confluent=True, schema_map={1: old, 2: _AVSC})
    values = _binary([
        _confluent(2, _avro(_AVSC, {"id": "new", "ts": 5, "amount": 2.0, "note": "n"})),
        _confluent(1, _avro(old, {"id": "old", "ts": 4})),
        _confluent(7, _avro(old, {"id": "x", "ts": 1})),
        b"\x01\x00\x00\x00\x01abc",
        b"\x00\x00",
        _confluent(1, b"\x02"),
    ])
    result = decoder.decode(values)
    assert result.errors == [
        (2, "unknown schema id 7"),
        (3, "bad magic byte 1 (not the Confluent framing)"),
        (4, "too short for the Confluent framing (2 bytes)"),
        (5, "invalid Avro: the record ends early"),
    ]
    assert result.table.to_pylist() == [
        {"id": "new", "ts": 5, "amount": 2.0, "note": "n"},
        {"id": "old", "ts": 4, "amount": None, "note": "none"},  # reader default applies
    ]


def test_avro_decoder_nested_schema_decodes() -> None:
    schema = {"type": "record", "name": "N", "fields": [
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "inner", "type": {"type": "record", "name": "I", "fields": [
            {"name": "x", "type": "double"}]}},
    ]}
    record = {"tags": ["a", "b"], "attrs": {"k": 1}, "inner": {"x": 1.5}}
    result = AvroDecoder(schema).decode(_binary([_avro(schema, record), b"\x08"]))
    assert result.good_index.tolist() == [0]
    assert [i for i, _ in result.errors] == [1]
    row = result.table.to_pylist()[0]
    assert row["tags"] == ["a", "b"]
    assert row["inner"] == {"x": 1.5}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schema": {"type": "record", "name": "x", "fields": [{"name": "a", "type": "nope"}]}},
         "bad Avro schema"),
        ({"schema": "/no/such/file.avsc"}, "cannot read Avro schema file"),
        ({"schema": _AVSC, "confluent": True}, "needs schema_map"),
        ({"schema": _AVSC, "schema_map": {1: _AVSC}}, "only used with confluent=True"),
    ],
)
def test_avro_decoder_bad_schema_raises_value_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AvroDecoder(**kwargs)


def test_avro_decoder_pickled_decodes_the_same() -> None:
    decoder = AvroDecoder(_AVSC, confluent=True, schema_map={3: _AVSC})
    values = _binary([_confluent(3, _avro(_AVSC, {"id": "a", "ts": 1, "amount": None,
                                                  "note": ""})), b"junk"])
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone.decode(values).table == decoder.decode(values).table
    assert clone.decode(values).errors == decoder.decode(values).errors


# --- decoder failures that are not bad data ---------------------------------------------------


class _BuggyJsonDecoder(JsonDecoder):
    """A JSON decoder with a bug: its vectorized parse fails on any value (not a data error)."""

    def _parse(self, values: pa.BinaryArray, multiline: bool, index: np.ndarray) -> pa.Table:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")


class _BuggyAvroDecoder(AvroDecoder):
    """An Avro decoder with a bug in its column decoding."""

    def _decode(self, schema_id: int, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray,
                index: np.ndarray) -> pa.Table:
        raise AttributeError("'NoneType' object has no attribute 'column'")


def test_json_decoder_bug_raises_decoder_error_instead_of_error_rows() -> None:
    values = _binary([b'{"id": "a", "ts": 1}', b"{bad", b'{"id": "c", "ts": 3}'])
    with pytest.raises(decode.DecoderError, match=r"failed on values 0\.\.2 \(not a data "
                       r"error\): TypeError: unsupported operand") as caught:
        _BuggyJsonDecoder("id STRING, ts BIGINT").decode(values)
    assert caught.value.rows == (0, 2), "the values it was decoding (the bad one was screened)"


def test_avro_decoder_bug_raises_decoder_error_instead_of_error_rows() -> None:
    good = _avro(_AVSC, {"id": "a", "ts": 1, "amount": 1.0, "note": "x"})
    with pytest.raises(decode.DecoderError, match=r"AttributeError: 'NoneType'"):
        _BuggyAvroDecoder(_AVSC).decode(_binary([good, good]))
