"""Schema evolution through the streaming job (docs/ingest.md, "Schema evolution"): the
producer adds a field and widens an int halfway, the job restarted with the new JSON DDL (same
checkpoint) evolves the table; the table equals the oracle (nulls before), hudi-rs reads it;
a job whose DDL would change a column's type another way fails naming the column, writing
nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import SchemaEvolutionError, Table
from ingest.kafka_produce import create_topic, produce
from jobs.ingest_job import start, watch
from jobs.job_config import load
from tests.helpers import Oracle, hudi_rs_read, sorted_rows
from tests.ingest.job_harness import job_settings, pending_instants, streaming_commits
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

COLUMNS = ["trip_id", "ts", "city", "qty", "note"]
V1 = "trip_id STRING, ts BIGINT, city STRING, qty INT"
V2 = "trip_id STRING, ts BIGINT, city STRING, qty BIGINT, note STRING"
LOSSY = "trip_id STRING, ts BIGINT, city STRING, qty FLOAT, note STRING"


def _send(bootstrap: str, topic: str, oracle: Oracle, rows: list[dict[str, Any]]) -> None:
    produce(bootstrap, topic, [(row["trip_id"].encode(), json.dumps(row).encode(), None)
                               for row in rows])
    oracle.upsert([{"note": None, **row} for row in rows])


def _run(spark: Any, settings: dict[str, Any], ddl: str) -> None:  # noqa: F811
    _, sink, query = start(load(None, {**settings, "decode.schema": ddl}), spark)
    watch(query, sink)


def test_stream_producer_adds_field_and_widens_int_table_evolves_as_oracle_and_hudi_rs(
        spark: Any, kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    topic = unique_topic("evolve")
    create_topic(kafka_bootstrap, topic, 2)
    # Copy-on-write: hudi-rs 0.5.0 reads a merge-on-read table whose log blocks both lack a
    # column and hold a narrower type only after compaction (tests/engine/
    # test_schema_evolution.py covers merge-on-read with it).
    settings = job_settings(tmp_path, kafka_bootstrap, topic, table_type="COPY_ON_WRITE")
    path = tmp_path / "trips"
    oracle = Oracle(key="trip_id")

    _send(kafka_bootstrap, topic, oracle, [
        {"trip_id": f"t{i:02d}", "ts": 1, "city": "ab"[i % 2], "qty": i} for i in range(30)])
    _run(spark, settings, V1)

    # Halfway the producer adds `note` and sends quantities past an int.
    _send(kafka_bootstrap, topic, oracle, [
        {"trip_id": f"t{i:02d}", "ts": 2, "city": "ab"[i % 2], "qty": 2**40 + i,
         "note": f"n{i}"} for i in (*range(0, 30, 3), *range(30, 36))])
    _run(spark, settings, V2)

    table = Table.open(str(path))
    ours = table.read()
    assert str(ours.schema.field("qty").type) == "int64"
    assert sorted_rows(ours, COLUMNS, "trip_id") == oracle.snapshot()
    assert sorted_rows(hudi_rs_read(path), COLUMNS, "trip_id") == oracle.snapshot()

    # qty as FLOAT would lose digits of a long: refused before any batch, naming the column.
    commits = streaming_commits(path)
    _send(kafka_bootstrap, topic, Oracle(key="trip_id"), [
        {"trip_id": "t99", "ts": 3, "city": "a", "qty": 1.5, "note": "lost"}])
    with pytest.raises(SchemaEvolutionError, match="'qty'"):
        _run(spark, settings, LOSSY)
    assert streaming_commits(path) == commits
    assert not pending_instants(path)
    assert sorted_rows(Table.open(str(path)).read(), COLUMNS, "trip_id") == oracle.snapshot()
