"""Deletes through the sink do not depend on where micro-batches are cut.

The same Kafka records (one Kafka partition: upserts with out-of-order ``ts``, marker deletes,
tombstones and, with the global index, partition moves) are cut into micro-batches several
ways; every cut must produce the same table, read alike by tidelake and by hudi-rs, and equal
to the oracle below — a plain dict applying each record in offset order:

* an upsert wins unless its ``ts`` is below the key's current ordering value (live or deleted);
* a marker delete (``_hoodie_is_deleted``) wins under the same rule and leaves the key deleted
  at its ``ts``;
* a tombstone deletes a live key at the live version's ``ts``; otherwise it changes nothing.

With the BUCKET index (no state) the table itself is what remembers a delete, so the BUCKET
records never bring a version older than a delete of its key in a later record (documented
in ``docs/ingest.md``); the GLOBAL_STATE records do.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.schema import normalize_input_schema
from ingest.decode import JsonDecoder
from ingest.sink import BUCKET, GLOBAL_STATE, RECORD_INDEX, HudiStreamingSink, SinkConfig
from tests.helpers import hudi_rs_read
from tests.ingest.helpers import (
    CITIES,
    KAFKA,
    Event,
    ParquetStream,
    data_frame,
    decoder,
    hudi_rs_rows,
    kafka_rows,
    run_stream,
    table_rows,
)
from tests.soak import rotate, rotation_note, soak
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

Row = tuple[str, int, float]


def oracle(events: Sequence[Event]) -> dict[str, Row]:
    """Live rows after ``events`` (one Kafka partition, offset order)."""
    live: dict[str, Row] = {}
    deleted_at: dict[str, int] = {}
    for e in events:
        current = live[e.id][1] if e.id in live else deleted_at.get(e.id)
        if e.tombstone:
            if e.id in live:
                deleted_at[e.id] = live.pop(e.id)[1]
        elif current is not None and e.ts < current:
            continue  # late: an equal or newer version (or delete) is already there
        elif e.delete:
            live.pop(e.id, None)
            deleted_at[e.id] = e.ts
        else:
            live[e.id] = (e.city, e.ts, e.fare)
            deleted_at.pop(e.id, None)
    return live


def records(rng: random.Random, n: int, *, moves: bool, late_after_delete: bool) -> list[Event]:
    """``n`` records over a few keys: upserts (some late), marker deletes and tombstones.

    With ``late_after_delete``, a delete is often followed soon by a version of its key older
    than the deleted one (it must lose, whichever batch it lands in).
    """
    keys = [f"k{i}" for i in range(4)]
    home = {k: rng.choice(CITIES) for k in keys}
    top: dict[str, int] = {}  # greatest ts seen per key
    floor: dict[str, int] = {}  # ts at or below which nothing may follow a delete
    pending: list[tuple[str, int]] = []  # late versions to send: (key, deleted at)
    clock = 100
    out: list[Event] = []
    for i in range(n):
        clock += 10
        if pending and rng.random() < 0.6:
            key, deleted_at = pending.pop(0)
            out.append(Event(key, deleted_at - rng.randrange(1, 20), home[key], -float(i)))
            continue
        key = rng.choice(keys)
        ts = clock if rng.random() < 0.6 else clock - rng.randrange(1, 60)
        if not late_after_delete and ts <= floor.get(key, -1):
            ts = clock
        r = rng.random()
        if r < 0.2 and key in top:
            out.append(Event(key, tombstone=True))
            floor[key] = max(floor.get(key, -1), top[key])
            if late_after_delete:
                pending.append((key, top[key]))
            continue
        city = rng.choice(CITIES) if moves and rng.random() < 0.35 else home[key]
        home[key] = city
        top[key] = max(top.get(key, ts), ts)
        if r < 0.35:
            out.append(Event(key, ts, city, delete=True))
            floor[key] = max(floor.get(key, -1), top[key])
            if late_after_delete:
                pending.append((key, ts))
        else:
            out.append(Event(key, ts, city, float(i)))
    return out


# The scenarios first: "a" (bucket 0 of 2, as "c") at 100, then a tombstone and an
# older version; later "a" moves oslo -> rome while "c", in the same oslo file group, gets a
# marker delete in the same batch (one delete block held two ordering types before).
PREFIX_GLOBAL = [Event("a", 100, "oslo", 1.0), Event("c", 100, "oslo", 2.0),
                 Event("a", tombstone=True), Event("a", 50, "oslo", 3.0),
                 Event("a", 200, "oslo", 4.0), Event("a", 210, "rome", 5.0),
                 Event("c", 220, "oslo", delete=True)]
# RECORD_INDEX: a key moves oslo -> rome, comes back, is deleted by a tombstone and comes
# back newer in lima; no version older than a delete follows it (the table remembers no
# deleted key, as with BUCKET).
PREFIX_RECORD_INDEX = [Event("a", 100, "oslo", 1.0), Event("c", 100, "oslo", 2.0),
                       Event("a", 90, "rome", 3.0), Event("a", 200, "rome", 4.0),
                       Event("a", 210, "oslo", 5.0), Event("c", 220, "oslo", delete=True),
                       Event("a", tombstone=True), Event("a", 230, "lima", 6.0)]
PREFIX_BUCKET = [Event("a", 100, "oslo", 1.0), Event("c", 100, "rome", 2.0),
                 Event("c", 90, "rome", 3.0), Event("a", tombstone=True),
                 Event("c", 220, "rome", delete=True), Event("a", 230, "lima", 4.0)]


def cuts(rng: random.Random, n: int) -> list[list[int]]:
    """Batch sizes: everything in one batch, then thirds and random cuts (four with
    ``TIDELAKE_SOAK=1``). At the CI size one cut besides the whole: the thirds or one random
    cut, by ``TIDELAKE_ROTATION_SEED`` (``tests/soak.py``): both cut the records into three or
    four micro-batches, which must give the table the whole batch gives."""
    out = [[n]]
    randoms = []
    for _ in range(soak(1, 4)):
        points = sorted(rng.sample(range(1, n), 3))
        randoms.append([b - a for a, b in zip([0, *points], [*points, n], strict=True)])
    for kind in rotate("delete-cuts", ("thirds", "random")):
        out += [[n // 3, n // 3, n - 2 * (n // 3)]] if kind == "thirds" else randoms
    return out


def _batches(events: list[Event], sizes: list[int]) -> list[list[Event]]:
    out, start = [], 0
    for size in sizes:
        out.append(events[start:start + size])
        start += size
    return out


@pytest.mark.spark
@pytest.mark.slow
# RECORD_INDEX's cut runs at the soak size: its moves, late versions and tombstones are in
# test_sink_record_index.py at the CI size.
@pytest.mark.parametrize(("index", "table_type", "seed"), [
    (BUCKET, "MERGE_ON_READ", 21), (BUCKET, "COPY_ON_WRITE", 22),
    (GLOBAL_STATE, "MERGE_ON_READ", 23), (GLOBAL_STATE, "COPY_ON_WRITE", 24),
    *soak([], [(RECORD_INDEX, "MERGE_ON_READ", 25)]),
])
def test_deletes_any_micro_batch_cut_gives_the_oracle_table_in_ours_and_hudi_rs(
        spark: Any, tmp_path: Path, index: str, table_type: str, seed: int) -> None:  # noqa: F811
    rng = random.Random(seed)
    global_index = index == GLOBAL_STATE
    prefix = {GLOBAL_STATE: PREFIX_GLOBAL, RECORD_INDEX: PREFIX_RECORD_INDEX}.get(index,
                                                                                PREFIX_BUCKET)
    events = prefix + records(rng, 24, moves=index != BUCKET, late_after_delete=global_index)
    expected = oracle(events)
    started = time.monotonic()
    for n, sizes in enumerate(cuts(rng, len(events))):
        path = str(tmp_path / f"t{n}")
        sink = HudiStreamingSink(SinkConfig(
            path, decoder=decoder(), record_key="id", precombine="ts",
            partition_by=["city"], table_type=table_type, index=index,
            num_buckets=2))
        if global_index:
            stream = ParquetStream(tmp_path / f"s{n}", "ev")
            for batch in _batches(events, sizes):
                stream.add(batch)
            run_stream(spark, stream, sink, tmp_path / f"ck{n}")
        else:
            offsets: dict[int, int] = {}
            for batch_id, batch in enumerate(_batches(events, sizes)):
                sink.process_batch(data_frame(spark, kafka_rows(batch, "ev", offsets)), batch_id)
                assert sink.last_result is not None and sink.last_result.errors == 0
        assert table_rows(path) == expected, f"cut {sizes} ({rotation_note()})"
        assert hudi_rs_rows(path) == expected, f"cut {sizes} (hudi-rs, {rotation_note()})"
    print(f"{index} {table_type}: {time.monotonic() - started:.1f} s")


@pytest.mark.spark
@pytest.mark.slow
def test_global_state_timestamp_ordering_in_non_utc_session_updates_bootstrapped_keys(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """The bootstrap stores UTC microseconds; pyspark's pandas conversion used to hand the
    operator session-local timestamps, so in New York an update of a bootstrapped key five
    hours newer than the stored one was judged older and dropped."""
    ddl = "id STRING, ts TIMESTAMP, city STRING, fare DOUBLE"
    path = str(tmp_path / "t")
    schema = normalize_input_schema(JsonDecoder(ddl).schema)
    seed = pa.table({"id": ["a", "b", "c"],
                     "ts": [dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone.utc)] * 3,
                     "city": ["oslo", "rome", "lima"], "fare": [1.0, 2.0, 3.0]}, schema=schema)
    Table.create(path, name="t", table_type="MERGE_ON_READ", record_key="id", precombine="ts",
                 partition_by=["city"], options={"hoodie.index.type": "BUCKET",
                                                 "hoodie.bucket.index.num.buckets": "2"}
                 ).upsert(seed)
    stream = ParquetStream(tmp_path, "ev")
    stream.add([
        Event("a", 0, "oslo", 9.0, raw=b'{"id": "a", "ts": "2024-01-01T13:00:00+00:00", '
                                       b'"city": "oslo", "fare": 9.0}'),
        Event("b", tombstone=True),
        Event("c", 0, "lima", 7.0, raw=b'{"id": "c", "ts": "2024-01-01T11:00:00+00:00", '
                                       b'"city": "lima", "fare": 7.0}')])
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        sink = HudiStreamingSink(SinkConfig(path, decoder=JsonDecoder(ddl), index=GLOBAL_STATE))
        run_stream(spark, stream, sink, tmp_path / "ck")
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    rows = {r["id"]: (r["fare"], r["ts"]) for r in
            Table.open(path).read(columns=["id", "fare", "ts"]).to_pylist()}
    at = dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone.utc)
    assert rows == {"a": (9.0, at + dt.timedelta(hours=1)), "c": (3.0, at)}
    theirs = hudi_rs_read(path)
    assert sorted(zip(theirs.column("id").to_pylist(), theirs.column("fare").to_pylist(),
                      strict=True)) == [("a", 9.0), ("c", 3.0)]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("table_type", ["MERGE_ON_READ", "COPY_ON_WRITE"])
def test_bucket_tombstone_on_partitioned_table_deletes_the_key_in_every_partition(
        spark: Any, tmp_path: Path, table_type: str) -> None:  # noqa: F811
    """Tombstones on partitioned BUCKET tables went to the error table before."""
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], table_type=table_type, num_buckets=2))
    offsets: dict[int, int] = {}
    first = [Event("a", 10, "oslo", 1.0), Event("a", 11, "rome", 2.0),
             Event("c", 10, "oslo", 3.0), Event("b", 10, "lima", 4.0)]
    sink.process_batch(data_frame(spark, kafka_rows(first, "ev", offsets)), 0)
    # "a" lives in oslo and rome (the BUCKET index is per partition); "d" is new in a new
    # partition and deleted in the same batch; "zz" does not exist.
    second = [Event("a", tombstone=True), Event("d", 20, "kyiv", 5.0), Event("d", tombstone=True),
              Event("zz", tombstone=True), Event("a", 5, "oslo", 6.0)]
    sink.process_batch(data_frame(spark, kafka_rows(second, "ev", offsets)), 1)
    result = sink.last_result
    assert result is not None and result.errors == 0
    expected = {"b": ("lima", 10, 4.0), "c": ("oslo", 10, 3.0)}
    assert table_rows(path) == expected
    assert hudi_rs_rows(path) == expected


@pytest.mark.spark
@pytest.mark.slow
def test_bucket_tombstone_with_json_kafka_key_deletes_complex_key_record(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    ddl = "id STRING, kind STRING, ts BIGINT, city STRING, fare DOUBLE"
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=JsonDecoder(ddl), record_key=["id", "kind"],
        precombine="ts", partition_by=["city"], num_buckets=2,
        key_format="json", error_table_path=str(tmp_path / "errors")))
    value = b'{"id": "a", "kind": "x", "ts": 1, "city": "oslo", "fare": 1.0}'
    other = b'{"id": "a", "kind": "y", "ts": 1, "city": "oslo", "fare": 2.0}'
    rows = [(b"k", value), (b"k", other)]
    keys = [b'{"id": "a", "kind": "x"}', b'{"id": "a"}']
    offsets = list(range(4))
    batch = pa.table({"key": [k for k, _ in rows] + keys,
                      "value": [v for _, v in rows] + [None, None],
                      "topic": ["ev"] * 4, "partition": [0] * 4, "offset": offsets,
                      "timestamp": [0] * 4}, schema=KAFKA)
    sink.process_batch(data_frame(spark, batch.slice(0, 2)), 0)
    sink.process_batch(data_frame(spark, batch.slice(2)), 1)
    result = sink.last_result
    assert result is not None and result.errors == 1  # {"id": "a"} names no full record key
    ours = Table.open(path).read(columns=["id", "kind"]).to_pylist()
    assert ours == [{"id": "a", "kind": "y"}]
    theirs = hudi_rs_read(path)
    assert theirs.select(["id", "kind"]).to_pylist() == ours
    errors = Table.open(str(tmp_path / "errors")).read().to_pylist()
    assert len(errors) == 1 and "record key field 'kind'" in str(errors[0])
