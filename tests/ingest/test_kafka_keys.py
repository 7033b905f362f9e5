"""Tombstones' Kafka keys: string, JSON or Avro, mapped to the record key the engine formats.

The judge is the record itself: a tombstone must come out with the same record key (and,
where its key holds them, the same partition) as the prepared upsert of the record it deletes,
which the engine's key generator computed from the value.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from engine import Table
from engine.errors import InvalidOptionError
from engine.schema import PARTITION_PATH, RECORD_KEY
from ingest.decode import JsonDecoder
from ingest.prepare import PrepareSpec, prepare_batch
from ingest.rows import DELETE, ERROR, OP, REASON, UPSERT
from ingest.sink_table import key_decoder
from jobs.job_config import load as load_job_config
from tests.ingest.helpers import KAFKA

DDL = "id STRING, kind STRING, ts BIGINT, city STRING"
KEY_AVSC = {"type": "record", "name": "Key", "fields": [
    {"name": "id", "type": "string"}, {"name": "kind", "type": "string"}]}


def _kafka(records: list[tuple[bytes | None, bytes | None]]) -> pa.Table:
    n = len(records)
    return pa.table({"key": [k for k, _ in records], "value": [v for _, v in records],
                     "topic": ["t"] * n, "partition": [0] * n, "offset": list(range(n)),
                     "timestamp": [0] * n}, schema=KAFKA)


def _spec(tmp_path: Path, key_format: str, key_schema: Any = None,
          tombstones: str = "bucket") -> PrepareSpec:
    table = Table.create(str(tmp_path / "t"), name="t", record_key=["id", "kind"],
                         precombine="ts", partition_by=["city"],
                         options={"hoodie.index.type": "BUCKET"})
    schema = JsonDecoder(DDL).schema
    return PrepareSpec(JsonDecoder(DDL), table.config, schema, tombstone_partition=tombstones,
                       key_decoder=key_decoder(key_format, key_schema, table.config, schema))


UPSERT_A = json.dumps({"id": "a", "kind": "x", "ts": 5, "city": "oslo"}).encode()


def _avro(record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(KEY_AVSC), record)
    return out.getvalue()


def test_tombstone_json_kafka_key_maps_to_the_records_complex_key_and_partition(
        tmp_path: Path) -> None:
    spec = _spec(tmp_path, "json")
    out = prepare_batch(_kafka([
        (b"a", UPSERT_A),
        (json.dumps({"id": "a", "kind": "x"}).encode(), None),
        (json.dumps({"kind": "x", "id": "a", "city": "oslo"}).encode(), None),
        (b"{not json", None),
        (json.dumps({"id": "a"}).encode(), None),
        (json.dumps({"id": "", "kind": "x"}).encode(), None),
    ]), spec).to_pylist()
    assert [r[OP] for r in out] == [UPSERT, DELETE, DELETE, ERROR, ERROR, ERROR]
    record = (out[0][RECORD_KEY], out[0][PARTITION_PATH])
    assert out[1][RECORD_KEY] == record[0] and out[1][PARTITION_PATH] is None
    assert (out[2][RECORD_KEY], out[2][PARTITION_PATH]) == record
    assert out[3][REASON].startswith("tombstone key does not decode")
    assert out[4][REASON] == "tombstone key: record key field 'kind' is null or empty"
    assert out[5][REASON] == "tombstone key: record key field 'id' is null or empty"


def test_tombstone_avro_kafka_key_maps_to_the_records_complex_key(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "avro", KEY_AVSC)
    out = prepare_batch(_kafka([(b"a", UPSERT_A), (_avro({"id": "a", "kind": "x"}), None),
                                (b"\x01", None)]), spec).to_pylist()
    assert [r[OP] for r in out] == [UPSERT, DELETE, ERROR]
    assert out[1][RECORD_KEY] == out[0][RECORD_KEY]
    assert out[2][REASON].startswith("tombstone key does not decode")


def test_tombstone_string_kafka_key_on_complex_key_table_must_be_the_formatted_key(
        tmp_path: Path) -> None:
    """Before, a plain key on a complex-key table made a delete that silently matched nothing."""
    spec = _spec(tmp_path, "string")
    first = prepare_batch(_kafka([(b"a", UPSERT_A)]), spec).to_pylist()[0]
    out = prepare_batch(_kafka([(b"a", None), (first[RECORD_KEY].encode(), None),
                                (b"\xff", None), (b"", None)]), spec).to_pylist()
    assert [r[OP] for r in out] == [ERROR, DELETE, ERROR, ERROR]
    assert "is not a record key of this table" in out[0][REASON]
    assert out[1][RECORD_KEY] == first[RECORD_KEY]
    assert out[2][REASON] == "tombstone key is not UTF-8"
    assert out[3][REASON] == "tombstone with an empty key"


def test_key_format_setting_bad_values_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="key_format"):
        _spec(tmp_path / "a", "protobuf")
    with pytest.raises(ValueError, match="key_schema"):
        _spec(tmp_path / "b", "avro")
    base = {"source": {"bootstrap_servers": "k:9092", "topics": ["t"]},
            "decode": {"schema": DDL}, "table": {"path": "/x", "record_key": ["id"]},
            "checkpoint": {"location": "/c"}}
    job = tmp_path / "job.toml"
    job.write_text(_toml(base))
    assert load_job_config(job, {"decode.key_format": "json"})["decode.key_format"] == "json"
    with pytest.raises(InvalidOptionError, match=r"decode\.key_schema"):
        load_job_config(job, {"decode.key_format": "avro"})
    with pytest.raises(InvalidOptionError, match=r"decode\.key_format"):
        load_job_config(job, {"decode.key_format": "xml"})


def _toml(sections: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"
