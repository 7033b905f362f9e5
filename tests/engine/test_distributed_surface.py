"""The engine surface the Spark glue calls (engine/write/distributed.py, engine/read/distributed.py,
engine/layout/incoming.py): the rules it composes agree with the engine's own paths."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from engine import Table
from engine.config import IndexType
from engine.index.consistent_hashing import committed_ring, locate_nodes
from engine.layout.incoming import key_buckets, ring_nodes
from engine.read.distributed import latest_completion
from engine.services.clustering import schedule_clustering
from engine.timeline.active import Timeline, completion_key
from engine.write.distributed import bucket_count, clustered, data_commits, write_pending

ROWS = pa.table({"id": [f"k{i}" for i in range(40)], "ts": list(range(40)),
                 "p": ["a", "b"] * 20})


def _table(path: Path, **options: str) -> Table:
    return Table.create(str(path), name="t", record_key="id", precombine="ts",
                        partition_by="p", options=options)


def test_clustered_bucket_tables_never_simple_tables_may_as_schedule_clustering(
        tmp_path: Path) -> None:
    bucket = _table(tmp_path / "b", **{"hoodie.index.type": "BUCKET",
                                       "hoodie.bucket.index.num.buckets": "4"})
    bucket.upsert(ROWS)
    assert not clustered(bucket.write_config)
    assert schedule_clustering(bucket.write_client()) is None
    simple = _table(tmp_path / "s", **{"hoodie.clustering.plan.strategy.small.file.limit":
                                       str(1 << 30)})
    for start in range(0, 40, 10):
        simple.upsert(ROWS.slice(start, 10))
    assert simple.write_config.index_type is IndexType.SIMPLE
    assert clustered(simple.write_config)
    assert schedule_clustering(simple.write_client()) is not None


def test_bucket_count_is_the_recorded_count_else_the_writers(tmp_path: Path) -> None:
    table = _table(tmp_path / "b", **{"hoodie.index.type": "BUCKET",
                                      "hoodie.bucket.index.num.buckets": "4"})
    assert table.config.num_buckets == 4
    assert bucket_count(table.config, table.write_config) == 4
    plain = _table(tmp_path / "s")
    assert plain.config.num_buckets is None
    assert bucket_count(plain.config, plain.write_config) == plain.write_config.num_buckets


def test_ring_nodes_are_the_nodes_of_each_partitions_committed_ring(tmp_path: Path) -> None:
    table = _table(tmp_path / "c", **{"hoodie.index.type": "BUCKET",
                                      "hoodie.index.bucket.engine": "CONSISTENT_HASHING",
                                      "hoodie.bucket.index.num.buckets": "4"})
    table.upsert(ROWS)
    keys, parts = ROWS.column("id"), ROWS.column("p")
    nodes, instants = ring_nodes(keys, parts, table.storage, 4)
    expected = [None] * ROWS.num_rows
    for ring, rows, at in locate_nodes(keys, parts,
                                       lambda part: committed_ring(table.storage, part, 4)):
        for row, node in zip(rows.tolist(), at.tolist(), strict=True):
            expected[row] = (node, ring.instant)
    assert list(zip(nodes.to_pylist(), instants.to_pylist(), strict=True)) == expected
    assert key_buckets(keys, 4).type == pa.int32()


def test_latest_completion_data_commits_and_write_pending(tmp_path: Path) -> None:
    table = _table(tmp_path / "t")
    assert latest_completion(table.storage, table.config) is None
    first = table.upsert(ROWS.slice(0, 20))
    second = table.upsert(ROWS.slice(20, 20))
    timeline = Timeline.load(table.storage, table.config)
    done = timeline.completed_data_instants
    assert latest_completion(table.storage, table.config) == completion_key(done[-1])
    assert [t for t, _ in data_commits(timeline)] == [first, second]
    assert not write_pending(timeline)
    _, instant = table.write_client().begin()
    assert write_pending(Timeline.load(table.storage, table.config))
    table.write_client().abort(instant)
