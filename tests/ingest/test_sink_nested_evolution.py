"""The streaming sink evolves a nested schema by the engine's rule
(:func:`engine.schema.evolve_schema`, docs/engine.md "Schema evolution"): a job restarted with
a decoder whose struct gained a field and widened one writes on; a job whose decoder drops a
nested field is refused at setup naming the field's path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.errors import SchemaEvolutionError
from ingest.decode import JsonDecoder
from ingest.sink import HudiStreamingSink, SinkConfig
from tests.helpers import hudi_rs_read
from tests.ingest.helpers import KAFKA, data_frame
from tests.spark_session import spark  # noqa: F401

V1 = "id STRING, ts BIGINT, city STRING, item STRUCT<name: STRING, qty: INT>"
V2 = "id STRING, ts BIGINT, city STRING, item STRUCT<name: STRING, qty: BIGINT, note: STRING>"
DROPPED = "id STRING, ts BIGINT, city STRING, item STRUCT<name: STRING>"


def _sink(path: str, ddl: str) -> HudiStreamingSink:
    return HudiStreamingSink(SinkConfig(path, decoder=JsonDecoder(ddl), record_key="id",
                                        precombine="ts", partition_by=["city"],
                                        table_type="MERGE_ON_READ",
                                        options={"hoodie.logfile.data.block.format": "avro"}))


def _kafka(records: list[dict[str, Any]], first_offset: int) -> pa.Table:
    n = len(records)
    return pa.table({
        "key": [r["id"].encode() for r in records],
        "value": [json.dumps(r).encode() for r in records],
        "topic": ["ev"] * n, "partition": [0] * n,
        "offset": list(range(first_offset, first_offset + n)),
        "timestamp": [1_700_000_000_000_000 + i for i in range(n)],
    }, schema=KAFKA)


def _rows(read: pa.Table) -> list[dict[str, Any]]:
    return sorted(read.select(["id", "ts", "city", "item"]).to_pylist(), key=lambda r: r["id"])


@pytest.mark.spark
def test_sink_nested_field_added_and_widened_then_dropped_field_refused(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    v1 = [{"id": k, "ts": 1, "city": "oslo", "item": {"name": k, "qty": i}}
          for i, k in enumerate(("a", "b", "c"))]
    _sink(path, V1).process_batch(data_frame(spark, _kafka(v1, 0)), 0)
    v2 = [{"id": "b", "ts": 2, "city": "oslo", "item": {"name": "b2", "qty": 2**40,
                                                         "note": "wide"}},
          {"id": "d", "ts": 2, "city": "oslo", "item": None}]
    sink = _sink(path, V2)
    sink.process_batch(data_frame(spark, _kafka(v2, 3)), 1)
    result = sink.last_result
    assert result is not None and result.errors == 0 and result.instant_time
    expected = [
        {"id": "a", "ts": 1, "city": "oslo", "item": {"name": "a", "qty": 0, "note": None}},
        {"id": "b", "ts": 2, "city": "oslo", "item": {"name": "b2", "qty": 2**40,
                                                       "note": "wide"}},
        {"id": "c", "ts": 1, "city": "oslo", "item": {"name": "c", "qty": 2, "note": None}},
        {"id": "d", "ts": 2, "city": "oslo", "item": None}]
    table = Table.open(path)
    assert table.read_schema().field("item").type == pa.struct(
        [("name", pa.string()), ("qty", pa.int64()), ("note", pa.string())])
    assert _rows(table.read()) == expected
    table.compact()  # hudi-rs 0.5.0 reads a log block of the older nested shape once compacted
    assert _rows(table.read()) == _rows(hudi_rs_read(path)) == expected
    with pytest.raises(SchemaEvolutionError, match=r"item\.qty") as refused:
        _sink(path, DROPPED)
    assert refused.value.column == "item.qty"
