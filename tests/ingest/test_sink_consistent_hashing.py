"""The streaming sink on consistent-hashing bucket tables (RFC-42): rows placed on each
partition's ring, resizes between and beside micro-batches, a ring that changes under a batch.

Judged like ``tests/ingest/test_sink.py``: a dict oracle, our reader and hudi-rs, and the ring
placement recomputed from the committed hashing metadata (``engine.index.consistent_hashing``)
for every stored row.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table
from engine.config import IndexType
from engine.errors import InvalidOptionError, WriteConflictError
from engine.index.consistent_hashing import HashingMetadata, load_metadata, xxh32
from engine.layout import view as view_module
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.write.distributed import Placement
from ingest import spark_write
from ingest.rows import BUCKET, FILE_ID, OP, PARTITION_PATH, RECORD_KEY, RING, UPSERT
from ingest.sink import HudiStreamingSink, SinkConfig
from tests.ingest.helpers import (
    Event,
    EventOracle,
    decoder,
    hudi_rs_rows,
    kafka_rows,
    random_batches,
    table_rows,
)
from tests.spark_session import spark  # noqa: F401

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

CH = {"hoodie.index.bucket.engine": "CONSISTENT_HASHING",
      # small files, so that a few hundred rows split a bucket (a base file of ~150 rows is
      # ~5 KB now that its bloom filter is sized to it)
      "hoodie.parquet.max.file.size": "1500", "hoodie.bucket.index.max.num.buckets": "16",
      "hoodie.compact.inline.max.delta.commits": "2"}


def _sink(path: str, **kwargs: Any) -> HudiStreamingSink:
    return HudiStreamingSink(SinkConfig(path, decoder=decoder(), record_key="id", precombine="ts",
                                        partition_by=["city"], num_buckets=2,
                                        options={**CH, **kwargs.pop("options", {})}, **kwargs))


def _rings(path: str) -> dict[str, HashingMetadata]:
    table = Table.open(path)
    timeline = Timeline.load(table.storage, table.config)
    found = {s.partition_path: load_metadata(table.storage, timeline, s.partition_path)
             for s in table.file_slices()}
    assert all(ring is not None for ring in found.values())
    return {p: ring for p, ring in found.items() if ring is not None}


def _completed(path: str) -> int:
    table = Table.open(path)
    return len(Timeline.load(table.storage, table.config).completed_data_instants)


def _check_placement(path: str) -> dict[str, HashingMetadata]:
    """Every stored row sits in the file group its partition's committed ring names."""
    rings = _rings(path)
    rows = Table.open(path).read(columns=["_hoodie_record_key", "_hoodie_partition_path",
                                          "_hoodie_file_name"]).to_pylist()
    for r in rows:
        ring = rings[r["_hoodie_partition_path"]]
        h = xxh32(r["_hoodie_record_key"].encode()) & 0x7FFFFFFF
        node = next((n for n in ring.nodes if n.value >= h), ring.nodes[0])
        assert r["_hoodie_file_name"].split("_")[0] == node.file_id, r
    return rings


def _feed(spark: Any, sink: HudiStreamingSink, oracle: EventOracle, offsets: dict[int, int],  # noqa: F811
          batch_id: int, events: list[Event]) -> None:
    events = [Event(e.id, e.ts, e.city, e.fare, e.delete, kafka_partition=int(e.id[1:]) % 2)
              for e in events]
    sink.process_batch(spark.createDataFrame(kafka_rows(events, "trips", offsets)), batch_id)
    oracle.apply(events)
    result = sink.last_result
    assert result is not None and result.instant_time and result.errors == 0


@pytest.mark.spark
@pytest.mark.slow
def test_ch_sink_matches_oracle_and_ring_across_resizes(spark: Any, tmp_path: Path  # noqa: F811
                                                        ) -> None:
    """Batches of inserts, updates, deletes and late versions into a consistent-hashing MOR
    table, with resizes (engine API) and compactions between them: after every batch our
    reader and hudi-rs equal the oracle, and every row sits where its partition's ring says;
    the hot partitions end with more buckets than they started with."""
    path = str(tmp_path / "trips")
    sink = _sink(path, services=False)
    oracle, offsets, clock = EventOracle(), {}, [0]
    rng = random.Random(11)
    for batch_id, events in enumerate(random_batches(rng, 6, 150, moves=False,
                                                     tombstones=False, clock=clock)):
        _feed(spark, sink, oracle, offsets, batch_id, events)
        assert table_rows(path) == oracle.rows
        if batch_id % 2 == 1:  # a compaction makes base files, a resize splits them
            Table.open(path, CH).compact()
            run = Table.open(path, CH).cluster()
            assert run.completed or run.scheduled is None
        _check_placement(path)
    assert hudi_rs_rows(path) == oracle.rows
    rings = _check_placement(path)
    assert max(len(r.nodes) for r in rings.values()) > 2, rings
    assert max(r.seq_no for r in rings.values()) >= 1


@pytest.mark.spark
def test_ch_sink_ring_changed_under_a_batch_retries_it_whole(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Prepare tasks place keys on the ring they read; the write tasks use the ring of the
    instant's snapshot. When they differ (a resize committed in between; simulated here by
    the driver's snapshot holding the ring from before a real resize), nothing of the batch is
    written and the sink writes it again; with no retries left it fails, committing nothing."""
    path = str(tmp_path / "trips")
    sink = _sink(path, services=False, conflict_retries=0)
    oracle, offsets = EventOracle(), {}
    first = [Event(f"k{i:04d}", 10 + i, "oslo", 1.0) for i in range(300)]
    _feed(spark, sink, oracle, offsets, 0, first)
    Table.open(path, CH).compact()
    assert Table.open(path, CH).cluster().completed  # oslo's ring is resized
    before = HashingMetadata.initial("oslo", 2)
    assert _rings(path)["oslo"] != before

    real = view_module.load_metadata
    stale_calls = [1]

    def snapshot_before_the_resize(storage: Any, timeline: Any, partition: str
                                   ) -> HashingMetadata | None:
        if stale_calls[0] > 0:
            stale_calls[0] -= 1
            return before if partition == "oslo" else real(storage, timeline, partition)
        return real(storage, timeline, partition)

    monkeypatch.setattr(view_module, "load_metadata", snapshot_before_the_resize)
    second = [Event(f"k{i:04d}", 1000 + i, "oslo", 2.0) for i in range(0, 300, 3)]
    completed = _completed(path)
    with pytest.raises(WriteConflictError, match="ring of partition 'oslo' changed"):
        _feed(spark, sink, EventOracle(), dict(offsets), 1, second)
    assert _completed(path) == completed
    assert table_rows(path) == oracle.rows

    sink.conflict_retries = 1
    stale_calls[0] = 1  # the first attempt sees the old ring, the retry the current one
    _feed(spark, sink, oracle, offsets, 1, second)
    assert sink.totals.retries == 1
    assert table_rows(path) == oracle.rows == hudi_rs_rows(path)
    _check_placement(path)


def test_place_on_rings_leaves_out_rows_placed_with_another_ring(tmp_path: Path) -> None:
    """Unit: rows whose RING is not the snapshot's are dropped and their partition named;
    a partition the snapshot lacks gets its initial ring, written to the table."""
    Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                 partition_by="p", table_type="MERGE_ON_READ",
                 options={"hoodie.index.type": "BUCKET", **CH})
    old = HashingMetadata.initial("a", 2)
    new = HashingMetadata("a", "20260101000000000", 2, 1, old.nodes[:1])
    rows = pa.table({RECORD_KEY: ["x", "y", "z"], PARTITION_PATH: ["a", "a", "b"],
                     OP: pa.array([UPSERT] * 3, pa.int8()), FILE_ID: pa.nulls(3, pa.string()),
                     BUCKET: pa.array([1, 0, 0], pa.int32()),
                     RING: [old.instant, old.instant, old.instant]})
    placement = Placement("t", 2, IndexType.BUCKET, Storage(str(tmp_path / "t")))
    placed, stale = spark_write.place_on_rings(rows, placement, {"a": new})
    assert stale == ("a",)
    assert placed.column(RECORD_KEY).to_pylist() == ["z"]
    assert placed.column(FILE_ID).to_pylist() == [HashingMetadata.initial("b", 2).nodes[0]
                                                  .file_id]
    folder = tmp_path / "t" / ".hoodie/.bucket_index/consistent_hashing_metadata/b"
    assert sorted(p.name for p in folder.iterdir()) == ["00000000000000.commit",
                                                        "00000000000000.hashing_meta"]
    placed, stale = spark_write.place_on_rings(rows, placement, {"a": old})
    assert stale == () and placed.column(FILE_ID).to_pylist()[:2] == [
        old.nodes[1].file_id, old.nodes[0].file_id]


@pytest.mark.spark
def test_ch_sink_tombstone_without_partition_goes_to_the_error_table(
        spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """A ring is per partition: a tombstone whose Kafka key names no partition cannot be
    placed, and is reported with its reason (marker deletes, which carry the partition,
    apply)."""
    path = str(tmp_path / "trips")
    sink = _sink(path, services=False, error_table_path=str(tmp_path / "errors"))
    oracle, offsets = EventOracle(), {}
    _feed(spark, sink, oracle, offsets, 0,
          [Event(f"k{i:04d}", 10 + i, "rome", 1.0) for i in range(20)])
    events = [Event("k0001", tombstone=True), Event("k0002", 500, "rome", delete=True)]
    sink.process_batch(spark.createDataFrame(kafka_rows(events, "trips", offsets)), 1)
    oracle.apply(events[1:])
    assert sink.last_result is not None and sink.last_result.errors == 1
    assert table_rows(path) == oracle.rows
    errors = Table.open(str(tmp_path / "errors")).read().to_pylist()
    assert len(errors) == 1 and "partition is unknown" in errors[0]["reason"]


def test_ch_sink_refuses_the_global_state_index_naming_the_option(tmp_path: Path) -> None:
    Table.create(str(tmp_path / "t"), name="t", record_key="id", precombine="ts",
                 table_type="MERGE_ON_READ", options={"hoodie.index.type": "BUCKET", **CH})
    with pytest.raises(InvalidOptionError, match=r"hoodie\.index\.bucket\.engine"):
        HudiStreamingSink(SinkConfig(str(tmp_path / "t"), decoder=decoder(), index="GLOBAL_STATE"))
    # the BUCKET index writes it
    HudiStreamingSink(SinkConfig(str(tmp_path / "t"), decoder=decoder(), index="BUCKET"))



@pytest.mark.spark
@pytest.mark.slow
def test_ch_sink_resizes_beside_its_batches(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    """The job's own services resize the rings (``hoodie.clustering.async.enabled``): compaction
    and resizes run on the service thread while micro-batches commit; the table equals the
    oracle (ours and hudi-rs) and every row sits where its partition's ring says."""
    path = str(tmp_path / "trips")
    sink = _sink(path, options={"hoodie.clustering.async.enabled": "true",
                                "hoodie.clustering.async.max.commits": "2",
                                "hoodie.cleaner.commits.retained": "2"})
    oracle, offsets, clock = EventOracle(), {}, [0]
    rng = random.Random(12)
    for batch_id, events in enumerate(random_batches(rng, 10, 120, moves=False,
                                                     tombstones=False, clock=clock)):
        _feed(spark, sink, oracle, offsets, batch_id, events)
    assert sink.services.drain(timeout=300), sink.services.state.describe()
    sink.services.stop()
    status = sink.services.state.services
    assert status["clustering"].done >= 1 and status["clustering"].failures == 0
    assert status["compaction"].failures == 0
    assert table_rows(path) == oracle.rows == hudi_rs_rows(path)
    rings = _check_placement(path)
    assert max(len(r.nodes) for r in rings.values()) > 2, rings
