"""A record prepares to the same row whatever its neighbours: a batch in which every record
decodes (prepared without copying columns) and a batch with bad records (whose good rows are
taken and scattered back) give each record the row, or the error reason, it gets alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from ingest.decode import JsonDecoder
from ingest.prepare import PrepareSpec, prepare_batch
from ingest.rows import ERROR, OP, REASON, UPSERT

DDL = ("id STRING, ts BIGINT, city STRING, at TIMESTAMP, "
       "n STRUCT<a: BIGINT, tags: ARRAY<STRING>>, x DOUBLE")

GOOD = [
    b'{"id":"k1","ts":1,"city":"a","at":"2024-01-05T10:00:00Z","n":{"a":1,"tags":["x"]},'
    b'"x":1.5}',
    b'{"id":"k2","ts":2,"city":"b","at":"2024-01-05T10:00:00+02:00","n":null,"x":null}',
    b'{"id":"k3","ts":3,"city":"a","at":"2024-01-05T10:00:00","n":{"a":null,"tags":[]}}',
    b'{"id":"\\u00e9t\\u00e9 \\ud83d\\ude00","ts":4,"city":"\\u0063","x":-0.0}',
    b'  {"id":"k6","ts":7,"city":"b","extra":{"deep":[1,2]}}  ',
    b'{"id":"k7",\n"ts":8,"city":"a"}',  # spans lines
    b'{"id":"k8","ts":9223372036854775807,"city":"a","x":1e308}',
]
HOSTILE: list[bytes | None] = [
    b'{"id":"h1","ts":1,"city":"a"',  # malformed
    b'[{"id":"h2"}]',  # not an object
    b"3",
    b"null",
    b"",
    b'{"id":"h3","ts":9223372036854775808,"city":"a"}',  # too large for BIGINT
    b'{"id":"h4","ts":"1","city":"a"}',  # a string for BIGINT
    b'{"id":"h5","ts":1,"city":"a","at":"yesterday"}',
    b'{"id":"h6","ts":1,"city":"a","n":{"a":"one"}}',  # a nested field of the wrong type
    b'{"id":"h7","ts":1,"city":"\xff"}',  # invalid UTF-8
    b'{"id":"","ts":1,"city":"a"}',  # an empty record key
    b'{"id":"h8","ts":null,"city":"a"}',  # no ordering value
    b'{"id":"h9","ts":5,"ts":6,"city":"a"}',  # a duplicate key (pyarrow.json refuses it)
    None,  # a null value without a Kafka key
]


def _spec(tmp_path: Path) -> PrepareSpec:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         partition_by=["city"])
    decoder = JsonDecoder(DDL)
    return PrepareSpec(decoder, table.config, decoder.schema, num_buckets=4)


def _kafka(values: list[bytes | None], offsets: list[int]) -> pa.Table:
    return pa.table({
        "key": pa.array([None] * len(values), pa.binary()),
        "value": pa.array(values, pa.binary()),
        "topic": ["t"] * len(values), "partition": pa.array([0] * len(values), pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array([0] * len(values), pa.timestamp("us", tz="UTC"))})


def _alone(spec: PrepareSpec, values: list[bytes | None]) -> list[dict[str, Any]]:
    """Each record prepared in a batch of its own."""
    return [prepare_batch(_kafka([v], [i]), spec).to_pylist()[0] for i, v in enumerate(values)]


def test_prepare_batch_all_good_batch_matches_each_record_alone(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    batch = prepare_batch(_kafka(GOOD, list(range(len(GOOD)))), spec)
    assert batch.column(OP).to_pylist() == [UPSERT] * len(GOOD)
    assert batch.to_pylist() == _alone(spec, GOOD)


@pytest.mark.parametrize("bad", HOSTILE)
def test_prepare_batch_good_records_beside_a_bad_one_match_each_alone(
        tmp_path: Path, bad: bytes | None) -> None:
    spec = _spec(tmp_path)
    values = [*GOOD[:3], bad, *GOOD[3:]]
    batch = prepare_batch(_kafka(values, list(range(len(values)))), spec)
    alone = _alone(spec, values)
    assert batch.to_pylist() == alone
    assert alone[3][OP] == ERROR and alone[3][REASON]


def test_prepare_batch_mixed_batch_rows_and_reasons_match_each_record_alone(
        tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    values = [v for pair in zip(GOOD, HOSTILE, strict=False) for v in pair] + HOSTILE[len(GOOD):]
    batch = prepare_batch(_kafka(values, list(range(len(values)))), spec)
    assert batch.to_pylist() == _alone(spec, values)
    assert [r[OP] == ERROR for r in batch.to_pylist()] == [v not in GOOD for v in values]
