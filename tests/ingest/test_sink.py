"""The streaming sink: Kafka rows into Hudi tables through Spark, exactly once.

Judged against a simple oracle (a dict applying each version in arrival order under event-time
rules) and against hudi-rs. Spark tests share the session of ``tests.spark_session``; micro-
batches come from static DataFrames handed to ``process_batch`` (the bucket index), from a
folder of Kafka-shaped parquet files read as a stream (the global-state index, which needs a
streaming query), and from a real Kafka-protocol broker end to end.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.config import MergeMode
from engine.errors import CorruptTableError, SchemaEvolutionError, TableNotFoundError
from engine.index.bucket import bucket_id
from engine.merge.policy import LIVE, KeyState, resolve_key
from engine.merge.record_merger import dedupe_batch
from engine.merge.resolve import resolve
from engine.schema import PARTITION_PATH
from engine.timeline.active import Timeline
from engine.write.write_client import WriteClient
from ingest.checkpoint import (
    HUDI_STREAMER_CHECKPOINT_KEY,
    QUERY_ID_KEY,
    SINK_CHECKPOINT_KEY,
    STREAMER_CHECKPOINT_KEY,
    CommittedBatch,
    checkpoint_metadata,
    is_committed,
    last_committed_batch,
    last_offsets,
    merge_offsets,
    starting_offsets_from_table,
)
from ingest.decode import DecoderError, JsonDecoder
from ingest.kafka_produce import create_topic, produce
from ingest.prepare import PrepareSpec, prepare_batch
from ingest.resolve import POLICY
from ingest.rows import (
    BUCKET,
    DELETE,
    ERROR,
    OFFSET,
    OP,
    ORDERING,
    ORDERING_NULL,
    REASON,
    SHARD,
    SPREAD,
    UPSERT,
    VERSIONS,
    pack_by_shard,
    pack_rows,
    packed_schema,
    shard_packed_schema,
    unpack_rows,
)
from ingest.sink import (
    GLOBAL_STATE,
    HudiStreamingSink,
    SinkConfig,
    TooManyBadRecordsError,
    start_ingest,
)
from tests.ingest.helpers import (
    CITIES,
    DDL,
    Event,
    EventOracle,
    ParquetStream,
    data_frame,
    decoder,
    hudi_rs_rows,
    kafka_rows,
    random_batches,
    run_stream,
    table_rows,
)
from tests.kafka_broker import kafka_bootstrap, unique_topic  # noqa: F401
from tests.spark_session import spark  # noqa: F401

# pyspark warns on the driver, each time a pandas-based plan (mapInArrow,
# transformWithStateInPandas) is built, that pandas >= 3 is not fully supported.
# kafka-python (imported by tests.kafka_broker) imports protocol modules lazily.
pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]


# --- reading commits back ---------------------------------------------------------------------


def commits(path: str | Path) -> list[dict[str, str]]:
    """Extra metadata of every completed commit, oldest first."""
    table = Table.open(str(path))
    timeline = Timeline.load(table.storage, table.config)
    return [dict(timeline.commit_metadata(i).extra_metadata)
            for i in timeline.completed_data_instants]


# --- unit: in-batch resolution, preparation, commit metadata (no Spark) -------------------------


def _versions(rng: random.Random, n: int) -> pa.Table:
    keys = [f"k{rng.randrange(6)}" for _ in range(n)]
    ops = [DELETE if rng.random() < 0.3 else UPSERT for _ in range(n)]
    null = [op == DELETE and rng.random() < 0.5 for op in ops]
    ordering = [0 if z else rng.randrange(5) for z in null]
    return pa.table({"_hoodie_record_key": keys, "_hoodie_partition_path": [""] * n,
                     OP: pa.array(ops, pa.int8()), ORDERING: pa.array(ordering, pa.int64()),
                     ORDERING_NULL: null, "seq": list(range(n))})


@pytest.mark.parametrize("event_time", [True, False])
def test_resolve_random_versions_match_scalar_rule_per_key(event_time: bool) -> None:
    rng = random.Random(7)
    for _ in range(200):
        rows = _versions(rng, rng.randrange(1, 25))
        keys = set(rows.column("_hoodie_record_key").to_pylist())
        stored = {k: rng.randrange(5) if event_time else None for k in sorted(keys)
                  if rng.random() < 0.5}
        resolved = resolve(rows, columns=VERSIONS, event_time=event_time, policy=POLICY,
                           stored=stored)
        got = {r["_hoodie_record_key"]: (r[OP], r["seq"], r[ORDERING], r[ORDERING_NULL])
               for t in (resolved.upserts, resolved.deletes) for r in t.to_pylist()}
        for key in keys:
            mine = [r for r in rows.to_pylist() if r["_hoodie_record_key"] == key]
            has_tombstone = any(r[OP] == DELETE and (r[ORDERING_NULL] or not event_time)
                                for r in mine)
            before = KeyState(LIVE, stored[key]) if key in stored and has_tombstone \
                else KeyState()
            out = resolve_key([r[OP] == DELETE for r in mine], [r[ORDERING] for r in mine],
                              [r[ORDERING_NULL] for r in mine], event_time=event_time,
                              policy=POLICY, stored=before)
            if out.winner < 0:  # nothing to write; without tombstones a delete may be written
                assert key not in got or (not has_tombstone and got[key][0] == DELETE), key
                continue
            w = mine[out.winner]
            assert got[key][:2] == (w[OP], w["seq"])
            if event_time:
                assert got[key][2] == out.ordering and not got[key][3]
        assert all(op == UPSERT for op in resolved.upserts.column(OP).to_pylist())


def test_resolve_upserts_only_agrees_with_engine_dedupe() -> None:
    rng = random.Random(11)
    for _ in range(50):
        n = rng.randrange(1, 30)
        rows = pa.table({"_hoodie_record_key": [f"k{rng.randrange(5)}" for _ in range(n)],
                         "ts": [rng.randrange(4) for _ in range(n)], "seq": list(range(n)),
                         OP: pa.array([UPSERT] * n, pa.int8()),
                         ORDERING_NULL: [False] * n})
        rows = rows.append_column(ORDERING, rows.column("ts"))
        ours = resolve(rows, columns=VERSIONS, event_time=True, policy=POLICY).upserts
        engine = dedupe_batch(rows, mode=MergeMode.EVENT_TIME_ORDERING, ordering_field="ts")
        assert sorted(ours.column("seq").to_pylist()) == sorted(engine.column("seq").to_pylist())


def test_prepare_batch_routes_bad_records_with_specific_reasons(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         partition_by=["city"], options={"hoodie.index.type": "BUCKET"})
    events = [
        Event("a", 1, "oslo", 1.0),
        Event("x", raw=b"{not json"),
        Event("b", raw=json.dumps({"id": "b", "city": "oslo"}).encode()),  # no ts
        Event("c", raw=json.dumps({"id": "", "ts": 3, "city": "oslo"}).encode()),
        Event("d", 4, "x" * 300, 1.0),
        Event("e", tombstone=True),
        Event("", raw=None, tombstone=True),
        Event("a", 6, "oslo", delete=True),
    ]
    spec = PrepareSpec(decoder(), table.config, JsonDecoder(DDL).schema)
    out = prepare_batch(kafka_rows(events, "t", {}), spec).to_pylist()
    assert [r[OP] for r in out] == [UPSERT, ERROR, ERROR, ERROR, ERROR, ERROR, ERROR, DELETE]
    reasons = [r[REASON] or "" for r in out]
    assert reasons[1].startswith("cannot decode the value: invalid JSON")
    assert reasons[2] == "ordering field 'ts' is null"
    assert reasons[3] == "record key field 'id' is null or empty"
    assert "too long for a folder name" in reasons[4]
    assert "tombstone on a partitioned table" in reasons[5]
    assert reasons[6] == "null value without a key (not a tombstone)"
    assert (out[0]["_hoodie_record_key"], out[0]["_hoodie_partition_path"]) == ("a", "oslo")
    assert (out[7][ORDERING], out[7][ORDERING_NULL]) == (6, False)
    assert out[1]["_tl_value"] == b"{not json" and out[0]["_tl_value"] is None


class _BuggyDecoder(JsonDecoder):
    """A decoder with a bug (not bad data): it fails on any value it parses."""

    def _parse(self, values: pa.BinaryArray, multiline: bool, index: Any) -> pa.Table:
        raise KeyError("_tl_rows")


def test_prepare_batch_decoder_bug_fails_naming_the_kafka_records(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         options={"hoodie.index.type": "BUCKET"})
    spec = PrepareSpec(_BuggyDecoder(DDL), table.config, JsonDecoder(DDL).schema)
    rows = kafka_rows([Event("a", tombstone=True), Event("b", 1, "oslo"),
                       Event("x", raw=b"nope"), Event("c", 2, "rome")], "ev", {0: 40})
    with pytest.raises(DecoderError, match=r"decoding records ev-0 offset 41 to ev-0 offset 43 "
                       r"failed \(not a bad record.*KeyError: '_tl_rows'"):
        prepare_batch(rows, spec)


def test_sink_on_table_with_corrupt_recorded_schema_raises_naming_the_file(
        tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = Table.create(path, name="t", record_key="id", precombine="ts",
                         options={"hoodie.index.type": "BUCKET"})
    table.upsert(pa.table({"id": ["a"], "ts": [1], "city": ["oslo"], "fare": [1.0]}),
                 extra_metadata={"schema": '{"type": "record", "fields": 7}'})
    with pytest.raises(CorruptTableError, match=r"\.hoodie/timeline/\d+_\d+\.deltacommit: "
                       "the table schema it records cannot be parsed"):
        HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts"))


def test_sink_schema_evolves_the_table_and_refuses_named_changes(tmp_path: Path) -> None:
    """A decoder with a new field and a wider type evolves the table's schema (the engine's
    rule); one that would change a type otherwise is refused naming the column; a batch of a
    job whose table another writer evolved since it started fails naming the column."""
    path = str(tmp_path / "t")
    table = Table.create(path, name="t", record_key="id", precombine="ts",
                         options={"hoodie.index.type": "BUCKET"})
    table.upsert(pa.table({"id": ["a"], "ts": [1], "qty": pa.array([1], pa.int32())}))

    def sink(ddl: str) -> HudiStreamingSink:
        return HudiStreamingSink(SinkConfig(path, decoder=JsonDecoder(ddl), record_key="id",
                                            precombine="ts"))

    evolved = sink("id STRING, ts BIGINT, qty BIGINT, note STRING")
    assert evolved.data_schema.names == ["id", "ts", "qty", "note"]
    assert evolved.data_schema.field("qty").type == pa.int64()
    with pytest.raises(SchemaEvolutionError, match="'qty'"):
        sink("id STRING, ts BIGINT, qty FLOAT")
    with pytest.raises(SchemaEvolutionError, match="'qty'"):
        sink("id STRING, ts BIGINT")
    nulls = HudiStreamingSink(SinkConfig(
        path, decoder=JsonDecoder("id STRING, ts BIGINT"), record_key="id", precombine="ts",
        options={"hoodie.write.set.null.for.missing.columns": "true"}))
    assert nulls.data_schema.names == ["id", "ts", "qty"]  # written as nulls
    with pytest.raises(ValueError, match="ordering field 'ts'"):  # never a null key or ordering
        HudiStreamingSink(SinkConfig(
            path, decoder=JsonDecoder("id STRING, qty INT"), record_key="id", precombine="ts",
            options={"hoodie.write.set.null.for.missing.columns": "true"}))
    running = sink("id STRING, ts BIGINT, qty INT")
    running._check_table_schema(Timeline.load(table.storage, table.config))
    table.upsert(pa.table({"id": ["b"], "ts": [2], "qty": [2], "city": ["oslo"]}))
    with pytest.raises(SchemaEvolutionError, match=r"'city'.*restart the job") as refused:
        running._check_table_schema(Timeline.load(table.storage, table.config))
    assert refused.value.column == "city"


def test_packed_rows_hold_each_file_group_once_and_unpack_to_the_same_rows(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         partition_by=["city"], options={"hoodie.index.type": "BUCKET"})
    rng = random.Random(5)
    events = [Event(f"k{rng.randrange(30)}", i, rng.choice(["oslo", "rome"]), 1.0)
              for i in range(300)] + [Event("x", raw=b"[") for _ in range(7)]
    spec = PrepareSpec(decoder(), table.config, JsonDecoder(DDL).schema, num_buckets=3,
                       pack=True)
    prepared = prepare_batch(kafka_rows(events, "t", {}), spec)
    packed = pack_rows(prepared, max_rows=40)
    assert packed.schema == packed_schema()
    keyed = [(r[PARTITION_PATH], r[BUCKET]) for r in packed.to_pylist() if r[BUCKET] is not None]
    unpacked = [unpack_rows(packed.slice(i, 1)) for i in range(packed.num_rows)]
    for (part, bucket), rows in zip(keyed, unpacked, strict=False):
        assert set(rows.column(PARTITION_PATH).to_pylist()) == {part}
        assert set(rows.column(BUCKET).to_pylist()) == {bucket} and rows.num_rows <= 40
        offsets = rows.column(OFFSET).to_pylist()
        assert offsets == sorted(offsets)  # input order within a pack
    errors = [r for r in packed.to_pylist() if r[BUCKET] is None]
    assert len(errors) == 1 and errors[0][SPREAD] == 300  # the first error's offset
    whole = unpack_rows(packed).sort_by(OFFSET)
    assert whole.equals(prepared.sort_by(OFFSET))
    per_group = Counter((r[PARTITION_PATH], r[BUCKET]) for r in prepared.to_pylist()
                        if r[BUCKET] is not None)
    assert Counter(keyed) == {g: -(-n // 40) for g, n in per_group.items()}  # 40 rows a pack


@pytest.mark.spark
def test_rows_packed_by_shard_hold_the_keys_of_sparks_shard(
        tmp_path: Path, spark: Any) -> None:  # noqa: F811
    from pyspark.sql import functions as F

    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         partition_by=["city"])
    rng = random.Random(8)
    ids = [f"k{rng.randrange(400)}" for _ in range(600)] + ["", "ключ", "😀" * 9, "x" * 40]
    events = [Event(k, i, rng.choice(["oslo", "rome"]), 1.0) for i, k in enumerate(ids)]
    events += [Event("x", raw=b"[") for _ in range(5)]
    spec = PrepareSpec(decoder(), table.config, JsonDecoder(DDL).schema,
                       tombstone_partition="state", pack=True,
                       state_shards=7)
    prepared = prepare_batch(kafka_rows(events, "t", {}), spec)
    packed = pack_by_shard(prepared, 7, max_rows=50)
    assert packed.schema == shard_packed_schema()
    assert None in packed.column(SHARD).to_pylist()  # the malformed records
    # Spark's xxhash64 rule is the oracle: checkpoints written when the bootstrap grouped
    # its rows with it hold shards by that rule.
    frame = spark.createDataFrame([(k,) for k in set(ids)], "k string")
    expected = {r["k"]: int(r["s"]) for r in frame.select(
        "k", F.pmod(F.xxhash64(F.col("k")), F.lit(7)).alias("s")).collect()}
    for i in range(packed.num_rows):
        rows = unpack_rows(packed.slice(i, 1))
        shard = packed.column(SHARD)[i].as_py()
        assert rows.num_rows <= 50
        if shard is None:  # the error rows, spread by their first offset
            assert set(rows.column(OP).to_pylist()) == {ERROR}
            assert packed.column(SPREAD)[i].as_py() == min(rows.column(OFFSET).to_pylist())
        else:
            assert {expected[k] for k in rows.column("_hoodie_record_key").to_pylist()} == \
                {shard}
    assert unpack_rows(packed).sort_by(OFFSET).equals(prepared.sort_by(OFFSET))


def test_prepare_batch_gives_keyed_rows_their_bucket(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                         partition_by=["city"], options={"hoodie.index.type": "BUCKET"})
    events = [Event(f"k{i}", i, "oslo", 1.0) for i in range(40)] + [Event("x", raw=b"[")]
    spec = PrepareSpec(decoder(), table.config, JsonDecoder(DDL).schema, num_buckets=7)
    out = prepare_batch(kafka_rows(events, "t", {}), spec).to_pylist()
    assert [r[BUCKET] for r in out[:40]] == [bucket_id(f"k{i}", 7) for i in range(40)]
    assert len({r[BUCKET] for r in out[:40]}) == 7
    assert out[40][OP] == ERROR and out[40][BUCKET] is None
    assert BUCKET not in prepare_batch(kafka_rows(events, "t", {}),
                                       PrepareSpec(decoder(), table.config,
                                                   JsonDecoder(DDL).schema)).column_names


def test_checkpoint_metadata_round_trips_through_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = Table.create(path, name="t", record_key="id")
    assert starting_offsets_from_table(str(tmp_path / "missing")) is None
    assert starting_offsets_from_table(path) is None
    first = merge_offsets(None, {("ev", 0): 9, ("ev", 1): 4})
    table.upsert(pa.table({"id": ["a"]}), extra_metadata=checkpoint_metadata("w", 0, "q1", first))
    second = merge_offsets(first, {("ev", 1): 7, ("other", 0): 0})
    assert second == {"ev": {0: 10, 1: 8}, "other": {0: 1}}
    table.upsert(pa.table({"id": ["b"]}), extra_metadata=checkpoint_metadata("w", 1, "q1", second))
    extra = commits(path)[-1]
    assert json.loads(extra[SINK_CHECKPOINT_KEY]) == {"w": "1"}
    assert extra[STREAMER_CHECKPOINT_KEY] == "ev,0:10,1:8;other,0:1"
    assert extra[HUDI_STREAMER_CHECKPOINT_KEY] == extra[STREAMER_CHECKPOINT_KEY]
    assert extra[QUERY_ID_KEY] == "q1"
    timeline = Timeline.load(table.storage, table.config)
    last = last_committed_batch(timeline, "w")
    assert last is not None and (last.batch_id, last.query_id) == (1, "q1")
    assert last_committed_batch(timeline, "someone-else") is None
    assert last_offsets(timeline) == second == starting_offsets_from_table(path)
    assert is_committed(last, 1, "q1") and is_committed(last, 0, "q1")
    assert not is_committed(last, 2, "q1")
    assert not is_committed(last, 0, "q2")  # a new query (lost checkpoint) starts at batch 0
    assert not is_committed(None, 0, None)
    assert is_committed(CommittedBatch(3, None, "x"), 3, None)


# --- Spark: the bucket index through process_batch ----------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize(("table_type", "version"), [
    ("MERGE_ON_READ", "8"), ("COPY_ON_WRITE", "8"),
    ("MERGE_ON_READ", "6"),  # [table.options] "hoodie.write.table.version" = "6"
])
def test_bucket_sink_batches_match_oracle_hudi_rs_and_run_in_tasks(
        spark: Any, tmp_path: Path, table_type: str, version: str) -> None:  # noqa: F811
    path = str(tmp_path / "trips")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], table_type=table_type, num_buckets=2,
        options={"hoodie.write.table.version": version}))
    oracle, offsets, clock = EventOracle(), {}, [0]
    rng = random.Random(3 if table_type == "MERGE_ON_READ" else 4)
    for batch_id, events in enumerate(random_batches(rng, 3, 40, moves=False,
                                                     tombstones=False, clock=clock)):
        # Keyed records: all versions of a key go to the same Kafka partition.
        events = [Event(e.id, e.ts, e.city, e.fare, e.delete, kafka_partition=int(e.id[1:]) % 2)
                  for e in events]
        sink.process_batch(data_frame(spark, kafka_rows(events, "trips", offsets)), batch_id)
        oracle.apply(events)
        result = sink.last_result
        assert result is not None and not result.skipped and result.instant_time
        assert result.errors == 0 and result.records == len(events)
        # Every file group was written inside a Spark task, in a Python worker process.
        assert result.tasks and len(result.tasks) == len(result.stats)
        assert all(t.task_attempt_id >= 0 and t.pid != os.getpid() for t in result.tasks)
        assert all((Path(path) / s.path).is_file() for s in result.stats)
        assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows
    last = commits(path)[-1]
    assert json.loads(last[SINK_CHECKPOINT_KEY]) == {"default_single_writer": "2"}
    assert last[STREAMER_CHECKPOINT_KEY] == f"trips,0:{offsets[0]},1:{offsets[1]}"
    assert starting_offsets_from_table(path) == {"trips": offsets}
    groups = {(s.partition_path, s.file_id[:8]) for s in Table.open(path).file_slices()}
    assert all(bucket in ("00000000", "00000001") for _, bucket in groups)
    assert Table.open(path).config.version == int(version)


@contextlib.contextmanager
def failing_commits(only: str | None = None) -> Iterator[None]:
    """Every commit (or only those of the table at ``only``) fails, as if storage went away."""
    original = WriteClient.finish
    root = os.path.realpath(only) if only else None

    def finish(self: WriteClient, *args: Any, **kwargs: Any) -> Any:
        if root is None or os.path.realpath(self.storage.base_path) == root:
            raise OSError("storage went away")
        return original(self, *args, **kwargs)

    WriteClient.finish = finish  # type: ignore[method-assign]
    try:
        yield
    finally:
        WriteClient.finish = original  # type: ignore[method-assign]


@pytest.mark.spark
def test_bucket_sink_replayed_batch_is_a_no_op_and_errors_go_to_error_table(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path, errors = str(tmp_path / "t"), str(tmp_path / "errors")
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"], table_type="MERGE_ON_READ",
                                        error_table_path=errors))
    events = [Event("a", 10, "oslo", 1.0), Event("b", 11, "rome", 2.0),
              Event("x", raw=b"\xff\xfe not utf-8"), Event("c", raw=b'{"id": "c"}'),
              Event("d", 12, "r" * 260, 3.0), Event("", tombstone=True)]  # no key
    rows = kafka_rows(events, "ev", {})
    sink.process_batch(data_frame(spark, rows), 0)
    first = sink.last_result
    assert first is not None and first.errors == 4 and first.error_instant_time
    assert table_rows(path) == {"a": ("oslo", 10, 1.0), "b": ("rome", 11, 2.0)}
    bad = Table.open(errors).read().sort_by("offset").to_pylist()
    assert [r["error_id"] for r in bad] == ["ev-0-2", "ev-0-3", "ev-0-4", "ev-0-5"]
    assert [r["value"] for r in bad][:2] == [b"\xff\xfe not utf-8", b'{"id": "c"}']
    assert bad[3]["kafka_key"] is None and bad[3]["value"] is None
    assert "invalid UTF-8" in bad[0]["reason"] and "ordering field 'ts'" in bad[1]["reason"]
    assert "too long" in bad[2]["reason"] and "not a tombstone" in bad[3]["reason"]
    assert {r["batch_id"] for r in bad} == {0}
    assert {r["_hoodie_partition_path"] for r in bad} == {"2023-11-14"}
    assert {r["target_table"] for r in bad} == {"t"}
    before = [(e.instant_time, e.state) for e in Table.open(path).timeline()]
    errors_before = Table.open(errors).timeline()

    sink.process_batch(data_frame(spark, rows), 0)  # Spark replays batch 0
    assert sink.last_result is not None and sink.last_result.skipped
    assert [(e.instant_time, e.state) for e in Table.open(path).timeline()] == before
    assert Table.open(errors).timeline() == errors_before

    # A failed commit leaves an inflight instant; the replay rolls it back and commits once.
    later = kafka_rows([Event("b", 20, "rome", 5.0), Event("y", raw=b"[]")], "ev", {0: 6})
    with failing_commits(), pytest.raises(OSError):
        sink.process_batch(data_frame(spark, later), 1)
    sink.process_batch(data_frame(spark, later), 1)
    assert table_rows(path) == {"a": ("oslo", 10, 1.0), "b": ("rome", 20, 5.0)}
    assert hudi_rs_rows(path) == table_rows(path)
    assert sorted(r["error_id"] for r in Table.open(errors).read().to_pylist()) == [
        "ev-0-2", "ev-0-3", "ev-0-4", "ev-0-5", "ev-0-7"]
    states = Counter(e.state for e in Table.open(path).timeline() if e.action != "rollback")
    assert states == Counter({"completed": 2})
    assert not list((Path(path) / ".hoodie" / ".temp").iterdir()), "staged errors are deleted"


@pytest.mark.spark
def test_bucket_sink_replay_after_the_error_commit_stages_no_error_rows(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path, errors = str(tmp_path / "t"), str(tmp_path / "errors")
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"], error_table_path=errors))
    rows = kafka_rows([Event("a", 10, "oslo", 1.0), Event("x", raw=b"nope"),
                       Event("b", 11, "rome", 2.0)], "ev", {})
    with failing_commits(only=path), pytest.raises(OSError):
        sink.process_batch(data_frame(spark, rows), 0)
    assert not commits(path) and len(commits(errors)) == 1
    errors_before = Table.open(errors).timeline()
    assert not list((Path(path) / ".hoodie" / ".temp").iterdir())

    sink.process_batch(data_frame(spark, rows), 0)  # the replay
    result = sink.last_result
    assert result is not None and result.errors == 1 and result.error_instant_time is None
    assert Table.open(errors).timeline() == errors_before
    assert [r["error_id"] for r in Table.open(errors).read().to_pylist()] == ["ev-0-1"]
    assert table_rows(path) == {"a": ("oslo", 10, 1.0), "b": ("rome", 11, 2.0)}
    assert len(commits(path)) == 1


@pytest.mark.spark
def test_bucket_sink_without_error_table_fails_naming_the_record(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    sink = HudiStreamingSink(SinkConfig(str(tmp_path / "t"), decoder=decoder(), record_key="id",
                                        precombine="ts", partition_by=["city"]))
    rows = kafka_rows([Event("a", 1, "oslo"), Event("x", raw=b"nope")], "ev", {})
    with pytest.raises(Exception, match=r"record ev-0 offset 1: cannot decode the value"):
        sink.process_batch(data_frame(spark, rows), 0)
    # The table was to be created by this batch: the failed batch leaves nothing behind.
    assert not sink.table_created and not list((tmp_path / "t").glob("**/*"))
    sink.process_batch(data_frame(spark, kafka_rows([Event("a", 1, "oslo")], "ev", {})), 0)
    with pytest.raises(Exception, match=r"record ev-0 offset 1: cannot decode the value"):
        sink.process_batch(data_frame(spark, kafka_rows([Event("x", raw=b"nope")], "ev", {0: 1})),
                           1)
    assert len(commits(tmp_path / "t")) == 1
    # The instant whose files the batch's tasks wrote is rolled back at once.
    assert [e.state for e in Table.open(str(tmp_path / "t")).timeline()
            if e.action != "rollback"] == ["completed"]


def test_sink_rejects_mismatched_table_and_bad_arguments(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"]))
    assert not sink.table_created and not (tmp_path / "t").exists(), "created by a batch"
    Table.create(path, name="t", record_key="id", precombine="ts", partition_by=["city"],
                 options={"hoodie.index.type": "BUCKET"})
    with pytest.raises(ValueError, match="partition_by"):
        HudiStreamingSink(SinkConfig(path, decoder=decoder(), partition_by=["id"]))
    with pytest.raises(ValueError, match="index"):
        HudiStreamingSink(SinkConfig(path, decoder=decoder(), index="BLOOM"))
    with pytest.raises(ValueError, match="reserved prefix"):
        HudiStreamingSink(SinkConfig(
            str(tmp_path / "u"), decoder=JsonDecoder("id STRING, _tl_x INT"),
            record_key="id"))
    with pytest.raises(ValueError, match="ordering field"):
        HudiStreamingSink(SinkConfig(str(tmp_path / "v"), decoder=decoder(), record_key="id",
                                     precombine="nope"))
    simple = str(tmp_path / "simple")
    Table.create(simple, name="simple", record_key="id")
    with pytest.raises(ValueError, match="BUCKET index"):
        HudiStreamingSink(SinkConfig(simple, decoder=decoder()))
    for bad in (-0.1, 1.5, "half", True):
        with pytest.raises(ValueError, match="max_error_fraction"):
            HudiStreamingSink(SinkConfig(str(tmp_path / "w"), decoder=decoder(), record_key="id",
                                         max_error_fraction=bad))  # type: ignore[arg-type]


WRONG_DDL = "id STRING, ts BIGINT, city STRING, fare STRING"
"""The sink's schema with ``fare`` as a string: every record of :class:`Event` is bad."""


def _good(n: int, start: int = 0) -> list[Event]:
    return [Event(f"k{i}", 10 + i, CITIES[i % 3], float(i)) for i in range(start, start + n)]


@pytest.mark.spark
def test_bucket_sink_schema_not_matching_data_fails_and_creates_nothing(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path, errors = str(tmp_path / "t"), str(tmp_path / "errors")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=JsonDecoder(WRONG_DDL), record_key="id",
        precombine="ts", partition_by=["city"], error_table_path=errors))
    rows = kafka_rows(_good(12), "ev", {})
    with pytest.raises(TooManyBadRecordsError,
                       match=r"12 of 12 records are bad.*most common reason \(12 records\): "
                             r"cannot decode the value: field 'fare': expected STRING"
                             r".*first: record ev-0 offset 0"):
        sink.process_batch(data_frame(spark, rows), 0)
    assert not sink.table_created and not (tmp_path / "t").exists()
    with pytest.raises(TableNotFoundError):
        Table.open(path)
    assert not commits(errors), "the error table commits nothing either"


@pytest.mark.spark
def test_bucket_sink_batch_over_max_error_fraction_commits_nothing_until_allowed(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path, errors = str(tmp_path / "t"), str(tmp_path / "errors")
    args: dict[str, Any] = dict(decoder=decoder(), record_key="id", precombine="ts",
                                partition_by=["city"], error_table_path=errors)
    sink = HudiStreamingSink(SinkConfig(path, **args))
    offsets: dict[int, int] = {}
    sink.process_batch(data_frame(spark, kafka_rows(_good(3), "ev", offsets)), 0)
    bad = [Event(f"x{i}", raw=b"{not json" if i % 3 else b"[]") for i in range(7)]
    rows = kafka_rows(_good(5, start=3) + bad, "ev", offsets)  # 7 of 12 bad: 58%
    before = Table.open(path).timeline(), Table.open(errors).timeline()
    with pytest.raises(TooManyBadRecordsError, match=r"batch 1: 7 of 12 records are bad "
                       r"\(58%, more than max_error_fraction 0.5\); most common reason "
                       r"\(4 records\): cannot decode the value: invalid JSON at char N"):
        sink.process_batch(data_frame(spark, rows), 1)
    after = Table.open(path).timeline(), Table.open(errors).timeline()
    assert [(e.instant_time, e.state) for e in after[0] if e.action != "rollback"] == [
        (e.instant_time, e.state) for e in before[0]]
    assert after[1] == before[1], "nothing reaches the error table"
    assert set(table_rows(path)) == {"k0", "k1", "k2"}

    # The operator decides these records are bad indeed: the replay goes through.
    lenient = HudiStreamingSink(SinkConfig(path, **args, max_error_fraction=1.0))
    lenient.process_batch(data_frame(spark, rows), 1)
    result = lenient.last_result
    assert result is not None and result.errors == 7 and result.instant_time
    assert set(table_rows(path)) == {f"k{i}" for i in range(8)}
    assert len(Table.open(errors).read()) == 7


@pytest.mark.spark
def test_bucket_sink_creates_the_table_with_the_first_valid_record_only(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path, errors = str(tmp_path / "t"), str(tmp_path / "errors")
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"], error_table_path=errors,
                                        max_error_fraction=1.0))
    offsets: dict[int, int] = {}
    sink.process_batch(data_frame(spark, kafka_rows([Event("x", raw=b"nope")] * 12, "ev",
                                                offsets)), 0)
    result = sink.last_result
    assert result is not None and result.errors == 12 and result.error_instant_time
    assert result.instant_time is None
    assert not sink.table_created and not (tmp_path / "t").exists()
    assert len(Table.open(errors).read()) == 12

    sink.process_batch(data_frame(spark, kafka_rows(_good(4), "ev", offsets)), 1)
    assert sink.table_created
    assert table_rows(path) == hudi_rs_rows(path) == {
        e.id: (e.city, e.ts, e.fare) for e in _good(4)}
    assert commits(path)[-1][STREAMER_CHECKPOINT_KEY] == "ev,0:16"


_SPECULATION_CHILD = """
import sys
from pyspark.sql import SparkSession
from engine.errors import InvalidOptionError
from ingest.decode import DecoderError, JsonDecoder
from ingest.sink import HudiStreamingSink, SinkConfig

spark = (SparkSession.builder.master("local[1]").config("spark.speculation", "true")
         .config("spark.ui.enabled", "false").getOrCreate())
sink = HudiStreamingSink(SinkConfig(sys.argv[1], decoder=JsonDecoder("id STRING, ts BIGINT"),
                                    record_key="id"))
rows = spark.createDataFrame(
    [(b"a", b'{"id": "a", "ts": 1}', "t", 0, 0, None)],
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP")
try:
    sink.process_batch(rows, 0)
    print("ACCEPTED")
except InvalidOptionError as exc:
    print("REFUSED", exc.key, "|", exc)
finally:
    spark.stop()
"""


@pytest.mark.spark
def test_sink_refuses_spark_speculation_naming_the_setting(tmp_path: Path) -> None:
    """A Spark session of its own (the conf is fixed when a SparkContext starts)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _SPECULATION_CHILD, str(tmp_path / "t")],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert "REFUSED spark.speculation | option 'spark.speculation': is 'true'" in done.stdout, \
        done.stdout + done.stderr[-3000:]
    assert not (tmp_path / "t").exists()


# --- Spark streaming: the global-state index -----------------------------------------------------


def _partition_of(path: str | Path) -> dict[str, str]:
    data = Table.open(str(path)).read(columns=["id", "_hoodie_partition_path"]).to_pylist()
    return {r["id"]: r["_hoodie_partition_path"] for r in data}


@pytest.mark.spark
@pytest.mark.slow
def test_global_state_index_moves_keys_and_deletes_tombstones_exactly_once(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """MOR with 2 key shards (the other global-index tests use the default 32): many keys
    share a shard's state, folded into a new base every other batch (a query restarted on
    the checkpoint catches up or rebuilds the workers' shard images)."""
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"], table_type="MERGE_ON_READ",
                                        index=GLOBAL_STATE, num_buckets=2, state_shards=2,
                                        error_table_path=str(tmp_path / "errors")))
    sink.state_fold = (1, 2)
    stream, oracle, clock = ParquetStream(tmp_path, "ev"), EventOracle(), [0]
    batches = list(random_batches(random.Random(5), 3, 30, moves=True, tombstones=True,
                                  clock=clock))
    batches[1] += [Event("bad", raw=b"{")]
    for events in batches:
        stream.add(events)
        oracle.apply(events)
    run_stream(spark, stream, sink, tmp_path / "ck")
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows
    assert _partition_of(path) == {k: v[0] for k, v in oracle.rows.items()}
    assert [r["error_id"] for r in Table.open(str(tmp_path / "errors")).read().to_pylist()] \
        == [f"ev-0-{len(batches[0]) + len(batches[1]) - 1}"]
    assert [json.loads(c[SINK_CHECKPOINT_KEY]) for c in commits(path)] == [
        {"default_single_writer": str(i)} for i in range(3)]

    # A key moves, then an older version of it arrives in its old partition: it loses.
    moved = sorted(oracle.rows)[0]
    city, ts, _ = oracle.rows[moved]
    other = next(c for c in CITIES if c != city)
    late = [Event(moved, ts + 1000, other, 7.0), Event(moved, ts + 1, city, 8.0)]
    stream.add(late[:1])
    stream.add(late[1:])
    oracle.apply(late[:1])
    run_stream(spark, stream, sink, tmp_path / "ck")
    assert table_rows(path) == oracle.rows
    assert _partition_of(path)[moved] == other


@pytest.mark.spark
@pytest.mark.slow
def test_global_state_index_update_partition_path_false_updates_keys_where_stored(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """``update_partition_path=False`` (the GLOBAL_STATE index's own setting; the engine's
    rule, ``engine.merge.policy.stays_in_place``): a key whose partition value changed is
    updated where it is stored, its row the new version's; a late version loses; a tombstone
    of such a key deletes it there; the key written again is new, in its own partition."""
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"], table_type="MERGE_ON_READ",
                                        index=GLOBAL_STATE, num_buckets=2, state_shards=2,
                                        update_partition_path=False))
    stream, oracle = ParquetStream(tmp_path, "ev"), EventOracle()
    for events in (
            [Event("a", 1, "oslo", 1.0), Event("b", 1, "oslo", 1.0), Event("c", 1, "rome", 1.0)],
            [Event("a", 2, "rome", 2.0), Event("b", 0, "lima", 9.0), Event("c", 2, "rome", 2.0),
             Event("d", 1, "lima", 1.0)],
            [Event("a", 3, "lima", 3.0), Event("a", tombstone=True), Event("b", 3, "lima", 3.0)],
            [Event("a", 4, "lima", 4.0), Event("d", 2, "oslo", 2.0)]):
        stream.add(events)
        oracle.apply(events)
    run_stream(spark, stream, sink, tmp_path / "ck")
    assert table_rows(path) == oracle.rows
    assert hudi_rs_rows(path) == oracle.rows
    assert _partition_of(path) == {"a": "lima", "b": "oslo", "c": "rome", "d": "lima"}


@pytest.mark.spark
@pytest.mark.slow
def test_global_state_index_bootstraps_from_existing_table_and_survives_failed_commits(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    path = str(tmp_path / "t")
    existing = Table.create(path, name="t", table_type="COPY_ON_WRITE", record_key="id",
                            precombine="ts", partition_by=["city"],
                            options={"hoodie.index.type": "BUCKET",
                                     "hoodie.bucket.index.num.buckets": "2"})
    seed = pa.table({"id": ["a", "b", "c"], "ts": [1, 1, 1], "city": ["oslo", "rome", "lima"],
                     "fare": [1.0, 2.0, 3.0], "_hoodie_is_deleted": [False] * 3})
    existing.upsert(seed)
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), index=GLOBAL_STATE))
    stream = ParquetStream(tmp_path, "ev")
    # Batch 0: "a" moves rome, "b" is deleted by a tombstone (no partition in it).
    stream.add([Event("a", 5, "rome", 9.0), Event("b", tombstone=True)])
    run_stream(spark, stream, sink, tmp_path / "ck")
    assert table_rows(path) == {"a": ("rome", 5, 9.0), "c": ("lima", 1, 3.0)}

    # Batch 1 fails at its commit: nothing of it may show, and its state must not stick.
    stream.add([Event("a", 6, "oslo", 10.0), Event("c", tombstone=True)])
    original = WriteClient.finish
    calls: list[int] = []

    def failing_finish(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise OSError("disk full")

    WriteClient.finish = failing_finish  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            run_stream(spark, stream, sink, tmp_path / "ck")
    finally:
        WriteClient.finish = original  # type: ignore[method-assign]
    assert calls and table_rows(path) == {"a": ("rome", 5, 9.0), "c": ("lima", 1, 3.0)}

    # Batch 1 again, and this time the commit lands but the query dies right after it.
    def finish_then_die(*args: Any, **kwargs: Any) -> Any:
        original(*args, **kwargs)
        raise OSError("driver lost after the commit")

    WriteClient.finish = finish_then_die  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="driver lost after the commit"):
            run_stream(spark, stream, sink, tmp_path / "ck")
    finally:
        WriteClient.finish = original  # type: ignore[method-assign]
    after_one = table_rows(path)
    assert after_one == {"a": ("oslo", 6, 10.0)}
    instants = len(commits(path))

    # The restarted query skips batch 1 (already committed) and goes on from its state.
    stream.add([Event("a", 7, "lima", 11.0), Event("c", 8, "rome", 12.0)])
    run_stream(spark, stream, sink, tmp_path / "ck")
    assert len(commits(path)) == instants + 1
    assert table_rows(path) == {"a": ("lima", 7, 11.0), "c": ("rome", 8, 12.0)}
    assert hudi_rs_rows(path) == table_rows(path)
    assert _partition_of(path) == {"a": "lima", "c": "rome"}


# --- Kafka end to end ---------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.kafka
def test_kafka_topic_to_table_end_to_end_with_resume_offsets(
        spark: Any, tmp_path: Path, kafka_bootstrap: str) -> None:  # noqa: F811
    from ingest.kafka_source import read_kafka_stream, starting_offsets_json

    topic = unique_topic("sink")
    create_topic(kafka_bootstrap, topic, 2)
    oracle, clock = EventOracle(), [0]
    events = next(random_batches(random.Random(9), 1, 60, moves=False, tombstones=False,
                                 clock=clock))
    events = [Event(e.id, e.ts, e.city, e.fare, e.delete, kafka_partition=int(e.id[1:]) % 2)
              for e in events] + [Event("junk", raw=b"junk")]
    produce(kafka_bootstrap, topic, [(e.id.encode(), e.value(), e.kafka_partition)
                                     for e in events])
    oracle.apply(events)
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], error_table_path=str(tmp_path / "errors")))
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
               "startingOffsets": "earliest"}
    query = start_ingest(spark, read_kafka_stream(spark, options), sink,
                         str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    assert table_rows(path) == oracle.rows
    ends = dict(Counter(e.kafka_partition for e in events))
    assert starting_offsets_from_table(path) == {topic: ends}
    assert json.loads(starting_offsets_json({topic: ends})) == {
        topic: {str(p): o for p, o in ends.items()}}
    assert Table.open(str(tmp_path / "errors")).read().num_rows == 1


def _recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, empty (waits until the deletion is done)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while True:
            try:
                create_topic(bootstrap, topic, partitions)
                return
            except Exception:  # the deletion is not done yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        admin.close()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.kafka
def test_kafka_checkpoint_after_accepted_loss_records_batch_end_of_unread_partition(
        spark: Any, tmp_path: Path, kafka_bootstrap: str) -> None:  # noqa: F811
    from ingest.kafka_source import read_kafka_stream, starting_offsets_json

    # The table recorded offset 10 for both partitions; the topic was recreated, the job
    # (failOnDataLoss=false) accepted the loss and resumed both at the new log's 0, then read
    # partition 0 only. Partition 1's recorded offset must go back to 0 with that commit, or a
    # job that lost its Spark checkpoint and resumes from the table skips offsets 0-9 there.
    topic = unique_topic("regress")
    create_topic(kafka_bootstrap, topic, 2)
    path, checkpoint = str(tmp_path / "t"), str(tmp_path / "ck")
    sink = HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"]))
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
               "startingOffsets": "earliest", "failOnDataLoss": "false"}
    oracle, clock = EventOracle(), iter(range(1, 1_000))

    def send(ids: Sequence[str], partition: int) -> None:
        events = [Event(i, next(clock), "oslo", 1.0, kafka_partition=partition) for i in ids]
        produce(kafka_bootstrap, topic, [(e.id.encode(), e.value(), partition) for e in events])
        oracle.apply(events)

    def run(options: dict[str, str], checkpoint: str) -> None:
        query = start_ingest(spark, read_kafka_stream(spark, options), sink, checkpoint,
                             trigger={"availableNow": True})
        query.awaitTermination(600)
        assert query.exception() is None

    for partition in (0, 1):
        send([f"old{partition}-{i}" for i in range(10)], partition)
    run(options, checkpoint)
    assert starting_offsets_from_table(path) == {topic: {0: 10, 1: 10}}

    _recreate_topic(kafka_bootstrap, topic, 2)
    run(options, checkpoint)  # accepts the loss: both partitions resume at 0, nothing read
    send([f"new0-{i}" for i in range(5)], 0)
    run(options, checkpoint)  # reads partition 0 only
    assert starting_offsets_from_table(path) == {topic: {0: 5, 1: 0}}

    # A job without its Spark checkpoint resumes from the table and misses nothing.
    send([f"new1-{i}" for i in range(4)], 1)
    resumed = {**options, "startingOffsets": starting_offsets_json(
        starting_offsets_from_table(path) or {})}
    run(resumed, str(tmp_path / "ck2"))
    assert table_rows(path) == oracle.rows
    assert starting_offsets_from_table(path) == {topic: {0: 5, 1: 4}}


def test_sink_refuses_key_field_without_java_text_at_setup(tmp_path: Path) -> None:
    from engine.errors import InvalidRecordError

    with pytest.raises(InvalidRecordError, match="'id'"):
        HudiStreamingSink(SinkConfig(
            str(tmp_path / "t"), decoder=JsonDecoder("id BINARY, ts BIGINT"),
            record_key="id", precombine="ts"))


@pytest.mark.spark
def test_bucket_sink_log_stats_name_the_slice_files_as_hudi(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """Streaming appends record the slice's base instant, base file and earlier logs
    (``HoodieAppendHandle``), as the engine's own appends do."""
    path = str(tmp_path / "t")
    sink = HudiStreamingSink(SinkConfig(
        path, decoder=decoder(), record_key="id", precombine="ts",
        partition_by=["city"], table_type="MERGE_ON_READ", num_buckets=1))
    offsets: dict[int, int] = {}
    for batch_id in range(3):
        sink.process_batch(data_frame(spark, kafka_rows([Event("a", batch_id + 1, "oslo", 1.0)],
                                                    "ev", offsets)), batch_id)
    table = Table.open(path)
    timeline = Timeline.load(table.storage, table.config)
    stats = [timeline.commit_metadata(i).write_stats[0]
             for i in timeline.completed_data_instants]
    names = [Path(s.path).name for s in stats]
    first = timeline.completed_data_instants[0].requested_time
    assert [s.log_files for s in stats] == [(names[0],), tuple(names[:2]), tuple(names)]
    assert all((s.prev_commit, s.base_file) == (first, "") for s in stats)
