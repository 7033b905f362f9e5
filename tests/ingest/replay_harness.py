"""The replay tests' shared parts: a job's settings, sample events and their oracle, and the
job's routing of one micro-batch played without Spark (:func:`route`) in the sink's order.

The sink (``ingest/sink.py``, ``_write_batch``) begins the batch's data instant first, then
writes and commits the error table's instant, and completes the data instant last; so a
batch's error-table commit is *later* than its data instant's time. :func:`route` does the
same with the job's own prepare step (:func:`ingest.prepare.prepare_batch` with the sink's
spec) and error rows (:func:`ingest.error_table.error_rows`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine import Table
from engine.errors import WriteConflictError
from engine.services.table_services import run_inline
from engine.write.write_client import UPSERT as UPSERT_OPERATION
from engine.write.write_client import WriteClient
from ingest.checkpoint import checkpoint_metadata
from ingest.error_table import ERROR_SCHEMA, error_rows
from ingest.prepare import prepare_batch
from ingest.rows import DELETE, OP, UPSERT
from jobs.ingest_job import build_decoder, build_sink
from jobs.job_config import load
from tests.helpers import Oracle, rows_by_key
from tests.ingest.helpers import KAFKA
from tests.s3 import S3Location

WRONG = ("trip_id STRING, ts BIGINT, rider STRING NOT NULL, city STRING, fare DOUBLE, "
         "_hoodie_is_deleted BOOLEAN")
FIXED = WRONG.replace(" NOT NULL", "")
COLUMNS = ("trip_id", "ts", "rider", "city", "fare")
CITIES = ("oslo", "lima")


def settings(work: Path, schema: str, *, bootstrap: str = "127.0.0.1:9", topic: str = "t",
             precombine: str | None = "ts", index: str = "BUCKET",
             key_format: str = "string", table_type: str = "MERGE_ON_READ",
             table_options: dict[str, str] | None = None,
             store: S3Location | None = None,
             bucket_engine: str | None = None) -> dict[str, Any]:
    """A job writing ``work/trips`` (error table ``work/trips_errors``) with ``schema``; in
    ``store``'s bucket when given."""
    found = {
        "source.bootstrap_servers": bootstrap, "source.topics": [topic],
        "source.max_offsets_per_trigger": 200,
        "decode.schema": schema, "decode.key_format": key_format,
        "table.path": str(work / "trips"), "table.name": "trips",
        "table.type": table_type, "table.record_key": "trip_id",
        "table.partition_by": "city", "index.type": index, "index.num_buckets": 2,
        "services.enabled": False, "trigger.available_now": True,
        "checkpoint.location": str(work / "checkpoint"),
        "errors.table_path": str(work / "trips_errors"),
        "spark.conf.spark.sql.shuffle.partitions": "2",
    }
    if precombine:
        found["table.precombine"] = precombine
    if bucket_engine:
        found["index.bucket_engine"] = bucket_engine
    found.update({f"table.options.{k}": v for k, v in (table_options or {}).items()})
    if store is not None:
        found.update({"table.path": store.uri("trips"),
                      "errors.table_path": store.uri("trips_errors")})
        found.update({f"table.storage.{k}": v for k, v in store.storage_options.items()})
    return found


def events(seed: int, count: int, first: int = 0) -> list[dict[str, Any] | bytes]:
    """Trip events with increasing ``ts``: inserts, updates and marker deletes, a quarter of
    the updates and deletes without a rider (bad under ``WRONG`` only), some of those with a
    fare that is not a number (bad under both, for another reason), and a few values that are
    not JSON. A key's first version always has its rider: a delete that arrives while its key
    was never stored leaves nothing in the table, and a replay of the key's earlier versions
    would bring it back (docs/ingest.md, "Replaying the error table", limits)."""
    rng = random.Random(seed)
    live: dict[str, str] = {}
    seen: set[str] = set()
    out: list[dict[str, Any] | bytes] = []
    for i in range(first, first + count):
        ts = 1_000 + i
        roll = rng.random()
        if roll < 0.03:
            out.append(b'{"trip_id": "broken", "ts": ')
            continue
        if live and roll < 0.12:
            key = rng.choice(sorted(live))
            record: dict[str, Any] = {"trip_id": key, "ts": ts, "city": live.pop(key),
                                      "_hoodie_is_deleted": True}
        else:
            key = rng.choice(sorted(live)) if live and roll < 0.5 else f"t{i:04d}"
            city = live.get(key) or rng.choice(CITIES)
            live[key] = city
            record = {"trip_id": key, "ts": ts, "city": city, "fare": round(rng.uniform(5, 50), 2)}
        if key not in seen or rng.random() < 0.75:  # a key's first version decodes (below)
            record["rider"] = f"r{rng.randint(1, 9)}"
        elif rng.random() < 0.2 and not record.get("_hoodie_is_deleted"):
            record["fare"] = "n/a"
        seen.add(key)
        out.append(record)
    return out


def fixed_oracle(sent: list[dict[str, Any] | bytes]) -> dict[str, tuple[Any, ...]]:
    """What the table holds once every record that decodes with ``FIXED`` is in: Hudi's
    rules (tests.helpers.Oracle) over the records by ``ts``."""
    oracle = Oracle(key="trip_id", ordering="ts")
    for record in sent:
        if isinstance(record, bytes) or not isinstance(record.get("fare", 0.0), float | int):
            continue
        if record.get("_hoodie_is_deleted"):
            oracle.delete([record["trip_id"]], record["ts"])
        else:
            oracle.upsert([{c: record.get(c) for c in COLUMNS}])
    return rows_by_key(oracle.snapshot(), "trip_id", COLUMNS)


def value(record: dict[str, Any] | bytes) -> bytes | None:
    """The Kafka value of ``record``: None for a tombstone (``{"trip_id": k, "tombstone": 1}``)."""
    if isinstance(record, bytes):
        return record
    return None if record.get("tombstone") else json.dumps(record).encode()


def key(record: dict[str, Any] | bytes, i: int) -> bytes:
    return f"bad{i}".encode() if isinstance(record, bytes) else record["trip_id"].encode()


def table_rows(path: Path) -> dict[str, tuple[Any, ...]]:
    return rows_by_key(Table.open(str(path)).read(columns=list(COLUMNS)), "trip_id", COLUMNS,
                       once=True)


def commits(path: Path) -> list[str]:
    return [e.instant_time for e in Table.open(str(path)).timeline()]


def route(work: Path, schema: str, records: list[dict[str, Any] | bytes], first_offset: int,
          *, before_data_commit: Callable[[], None] | None = None, **options: Any) -> None:
    """What the job does with one micro-batch of ``records`` (Kafka partition 0 from
    ``first_offset``), in the sink's order: the data instant begins, the bad rows are
    written and committed in the error table, the good ones complete the data instant, whose
    commit records the offsets read (as the job's). ``before_data_commit`` runs between the
    error table's commit and the data instant's (another writer, say). A data commit refused
    by a concurrent one is rolled back and the batch written again, as the sink retries it
    (its error rows are committed already)."""
    config = load(None, settings(work, schema, **options))
    sink = build_sink(config, build_decoder(config))
    n = len(records)
    kafka = pa.table({"key": [key(r, i) for i, r in enumerate(records)],
                      "value": [value(r) for r in records], "topic": ["t"] * n,
                      "partition": [0] * n, "offset": list(range(first_offset, first_offset + n)),
                      "timestamp": [1_700_000_000_000_000] * n}, schema=KAFKA)
    prepared = prepare_batch(kafka, sink.spec)
    assert sink.error_table is not None
    good = prepared.filter(pc.is_in(prepared.column(OP), pa.array([UPSERT, DELETE], pa.int8())))
    table = sink.table
    if good.num_rows and not table.exists:
        table.materialize()
    client = WriteClient(table.storage, table.config, table.write_config)
    started = client.begin() if good.num_rows else None  # the data instant first, as the sink
    bad = error_rows(prepared, batch_id=0, target_table="trips", config=sink.error_table.config)
    if bad.num_rows:
        sink.error_table.upsert(bad.select(ERROR_SCHEMA.names))
    if before_data_commit is not None:
        before_data_commit()
    if started is None:
        return
    data = good.select([f.name for f in sink.data_schema])
    marker = pc.equal(good.column(OP), DELETE)  # marker deletes: prepare deletes them
    offsets = {"t": {0: first_offset + n}}
    for attempt in range(3):
        timeline, inflight = started if attempt == 0 else client.begin()
        try:
            records_, deletes = client.prepare(data.append_column("_hoodie_is_deleted", marker),
                                               timeline, dedupe=True)
            plan = client.plan(timeline, inflight, UPSERT_OPERATION, records_, deletes,
                               checkpoint_metadata("job", 0, None, offsets))
            client.commit(timeline, plan, client.execute_local(plan))
        except WriteConflictError:
            client.abort(inflight)
            continue
        except BaseException:
            client.abort(inflight)
            raise
        run_inline(client)  # the table's services, as Table.upsert runs them
        return
    raise AssertionError("the batch was refused three times")


def fixed_sink(work: Path, **options: Any) -> Any:
    config = load(None, settings(work, FIXED, **options))
    return build_sink(config, build_decoder(config))
