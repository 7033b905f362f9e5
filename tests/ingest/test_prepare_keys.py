"""The streaming preparation formats keys and partition folders with the engine's key
generator: the same Java texts as ``Table.upsert`` writes (no Spark needed)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa

from engine import Table
from ingest.decode import JsonDecoder
from ingest.prepare import PrepareSpec, prepare_batch
from ingest.rows import UPSERT

DDL = "id DOUBLE, ts BIGINT, city STRING, d DATE"


def _kafka(values: list[dict[str, object]]) -> pa.Table:
    return pa.table({
        "key": [None] * len(values), "value": [json.dumps(v).encode() for v in values],
        "topic": ["t"] * len(values), "partition": [0] * len(values),
        "offset": list(range(len(values))), "timestamp": [0] * len(values)})


def test_prepare_batch_keys_and_partitions_match_engine_writer_java_texts(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         partition_by=["city", "d"])
    decoder = JsonDecoder(DDL)
    rows = [{"id": 2.0, "ts": 1, "city": ".hoodie", "d": "2024-01-05"},
            {"id": 1e7, "ts": 1, "city": "a:b", "d": "2024-01-06"}]
    out = prepare_batch(_kafka(rows), PrepareSpec(decoder, table.config, decoder.schema))
    got = [(r["_tl_op"], r["_hoodie_record_key"], r["_hoodie_partition_path"])
           for r in out.to_pylist()]
    # COMPLEX key generator (two partition fields): "field:value"; Double.toString texts;
    # partition values escaped as Java's escapePathName plus the leading '.'.
    assert got == [(UPSERT, "id:2.0", "%2Ehoodie/2024-01-05"),
                   (UPSERT, "id:1.0E7", "a%3Ab/2024-01-06")]
    typed = [{**r, "d": dt.date.fromisoformat(str(r["d"]))} for r in rows]
    table.upsert(pa.Table.from_pylist(typed, schema=decoder.schema))
    written = table.read()
    assert sorted(zip(written.column("_hoodie_record_key").to_pylist(),
                      written.column("_hoodie_partition_path").cast(pa.string()).to_pylist(),
                      strict=True)) == sorted((k, p) for _, k, p in got)


def test_prepare_spec_json_ring_table_travels_as_its_location_without_options(
        tmp_path: Path) -> None:
    """A consistent-hashing spec crosses to the source's tasks as JSON (a Spark option, shown
    in plans): the ring table goes as its location, its storage options never."""
    from engine.storage import Storage
    from ingest.prepare import spec_from_json, spec_to_json

    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts")
    decoder = JsonDecoder(DDL)
    storage = Storage(str(tmp_path / "t"), {"aws_secret_access_key": "s3cr3t-never-shown"})
    spec = PrepareSpec(decoder, table.config, decoder.schema, num_buckets=4, ring_table=storage)
    text = spec_to_json(spec)
    assert "s3cr3t" not in text
    back = spec_from_json(text)
    assert back.ring_table is not None
    assert back.ring_table.base_path == storage.base_path
    assert back.num_buckets == 4 and spec_to_json(back) == text
