"""Which live file groups are bucket groups is one rule (engine.write.placement.live_buckets).

The write client (``Table.upsert``) and the streaming job (its write tasks and its global-state
index, which pass the table's ``write_config.index_type``) ask it alike. On a table whose
``hoodie.properties`` records no index (written by another tool) the writer's
``hoodie.index.type`` decides, as in Hudi: bucket layout only under ``BUCKET``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from engine import Table
from engine.config import P_CHECKSUM, P_DATABASE, P_NAME, IndexType, table_checksum
from engine.layout.properties import dumps, loads
from engine.layout.view import TableView
from engine.write.placement import bucket_file_ids, live_buckets, record_buckets

BUCKET_OPTIONS = {"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": "3"}
CITIES = ("a", "b", "c")


def _rows(n: int, ts: int) -> pa.Table:
    return pa.table({"id": [f"k{i}" for i in range(n)], "ts": [ts] * n,
                     "city": [CITIES[i % 3] for i in range(n)],
                     "fare": [float(i) for i in range(n)]})


def _table_without_recorded_index(path: Path) -> None:
    """A bucket table whose ``hoodie.properties`` then loses its index keys, as another writer
    leaves it: renamed too, so that its bucket groups are not the ids tidelake would derive
    for a new bucket of this table (:func:`engine.write.placement.new_bucket_file_id`)."""
    table = Table.create(str(path), name="other", record_key="id", precombine="ts",
                         partition_by="city", table_type="COPY_ON_WRITE", options=BUCKET_OPTIONS)
    table.upsert(_rows(30, 1))
    props_path = path / ".hoodie" / "hoodie.properties"
    props = loads(props_path.read_text("latin-1"))
    for key in ("hoodie.index.type", "hoodie.bucket.index.num.buckets",
                "hoodie.index.bucket.engine"):
        props.pop(key, None)
    props[P_NAME] = "unrecorded"
    props[P_CHECKSUM] = str(table_checksum(props.get(P_DATABASE, "default"), "unrecorded"))
    props_path.write_text(dumps(props), "latin-1")


def _groups(table: Table) -> set[tuple[str, str]]:
    return {(s.partition_path, s.file_id) for s in table.file_slices()}


def test_live_buckets_table_without_recorded_index_bucket_writer_paths_agree(
        tmp_path: Path) -> None:
    _table_without_recorded_index(tmp_path)
    table = Table.open(str(tmp_path), BUCKET_OPTIONS)
    assert table.config.index_type is None and table.config.num_buckets is None
    before = _groups(table)

    # The streaming path: the groups its tasks name for the keys, from the same rule.
    view = TableView.load(table.storage, table.config)
    live = live_buckets(view, table.write_config.index_type)
    rows = _rows(30, 2)
    streamed = bucket_file_ids(rows.column("city").combine_chunks(),
                               pa.array(record_buckets(rows.column("id"), 3)),
                               table_name=table.config.name, live=live)
    # The write client's path: updates land in the groups that hold the keys.
    table.upsert(rows)

    assert set(zip(rows.column("city").to_pylist(), streamed.to_pylist(),
                   strict=True)) == before
    assert _groups(table) == before


def test_live_buckets_table_without_recorded_index_simple_writer_has_none(
        tmp_path: Path) -> None:
    _table_without_recorded_index(tmp_path)
    table = Table.open(str(tmp_path))
    view = TableView.load(table.storage, table.config)
    assert table.write_config.index_type is IndexType.SIMPLE
    assert view.bucket_groups()  # file ids that start with 8 digits...
    assert live_buckets(view, table.write_config.index_type) == {}  # ...are no bucket groups


def test_insert_file_ids_same_on_replay_and_split_by_bucket_counts() -> None:
    from engine.write.partitioner import InsertBucket, insert_file_ids

    buckets = [InsertBucket("p", "small", 1_000, None), InsertBucket("p", "new", 3_000, None)]
    keys = pa.array([f"k{i}" for i in range(4_000)])
    first = insert_file_ids(keys, buckets).to_pylist()
    assert insert_file_ids(keys, buckets).to_pylist() == first  # a replay places alike
    counts = {fid: first.count(fid) for fid in ("small", "new")}
    assert sum(counts.values()) == 4_000
    assert 800 < counts["small"] < 1_200  # weighted by the buckets' counts, on average
