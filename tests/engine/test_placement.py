"""Which live file groups are bucket groups is one rule (engine.layout.view.live_buckets).

The write client (``Table.upsert``) and the streaming job (its write tasks and its global-state
index, which pass the table's ``write_config.index_type``) ask it alike. On a table whose
``hoodie.properties`` records no index (written by another tool) the writer's
``hoodie.index.type`` decides, as in Hudi: bucket layout only under ``BUCKET``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from engine import Table
from engine.config import P_CHECKSUM, P_DATABASE, P_NAME, IndexType, table_checksum
from engine.layout.properties import dumps, loads
from engine.layout.view import TableView, live_buckets
from engine.write.placement import bucket_file_ids, record_buckets

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


# -- reads by key find every row the writers placed (the reader prunes by the same rule) ------

def _latest(rows: list[dict[str, object]]) -> dict[str, object]:
    return {str(r["id"]): r["ts"] for r in rows}


def _key_reads_find_every_row(path: str, oracle: dict[str, int]) -> dict[str, Any]:
    """Every key read by a key filter (one key, then all at once) gives the oracle's row, in
    our reader and hudi-rs's; returns the explain of the read of all keys."""
    from tests.helpers import hudi_rs_read

    table = Table.open(path)
    keys = sorted(oracle)
    for key in keys[:: max(1, len(keys) // 40)]:
        assert _latest(table.read(filters=[("id", "=", key)]).to_pylist()) == {key: oracle[key]}
    assert _latest(table.read(filters=[("id", "in", keys)]).to_pylist()) == oracle
    theirs = _latest(hudi_rs_read(path).to_pylist())
    assert theirs == oracle
    return table.explain(filters=[("id", "in", keys[:3])])


def test_key_reads_bucket_table_find_every_row_and_prune_by_bucket(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = Table.create(path, name="t", record_key="id", precombine="ts", partition_by="city",
                         table_type="MERGE_ON_READ", options=BUCKET_OPTIONS)
    table.upsert(_rows(60, 1))
    Table.open(path).upsert(_rows(45, 2))
    oracle = {f"k{i}": (2 if i < 45 else 1) for i in range(60)}
    explained = _key_reads_find_every_row(path, oracle)
    assert explained["slices_pruned_by_bucket_or_footer"] > 0


def test_key_reads_table_without_recorded_index_find_every_row(tmp_path: Path) -> None:
    """Bucket groups another writer placed (its bucket count recorded nowhere), then a
    tidelake writer's updates and inserts: a read by key prunes nothing it cannot tell."""
    _table_without_recorded_index(tmp_path)
    Table.open(str(tmp_path), BUCKET_OPTIONS).upsert(_rows(40, 2))
    oracle = {f"k{i}": 2 for i in range(40)}
    _key_reads_find_every_row(str(tmp_path), oracle)


def test_key_reads_consistent_hashing_after_resize_find_every_row(tmp_path: Path) -> None:
    """A consistent-hashing table whose buckets a clustering split (the ring's 4 buckets
    became 8 nodes; hoodie.properties still records 4), then updated: every key is found."""
    from engine.index.consistent_hashing import load_metadata
    from engine.timeline.active import Timeline

    path = str(tmp_path / "t")
    options = {"hoodie.index.type": "BUCKET", "hoodie.index.bucket.engine": "CONSISTENT_HASHING",
               "hoodie.bucket.index.num.buckets": "4", "hoodie.parquet.max.file.size": "20000",
               "hoodie.bucket.index.max.num.buckets": "8", "hoodie.compact.inline": "false",
               "hoodie.clean.automatic": "false"}
    Table.create(path, name="t", record_key="id", precombine="ts", partition_by="city",
                 table_type="MERGE_ON_READ", options=options)
    oracle: dict[str, int] = {}
    for batch in range(3):
        ids = range(batch * 2000, (batch + 1) * 2000)
        rows = pa.table({"id": [f"k{i:06d}" for i in ids], "ts": [batch] * 2000,
                         "city": ["a"] * 2000, "pad": [f"{i:x}" * 12 for i in ids]})
        Table.open(path, options).upsert(rows)
        oracle.update({f"k{i:06d}": batch for i in ids})
    Table.open(path, options).compact()
    assert Table.open(path, options).cluster().completed
    table = Table.open(path)
    ring = load_metadata(table.storage, Timeline.load(table.storage, table.config), "a")
    assert ring is not None and len(ring.nodes) > table.config.num_buckets == 4
    update = list(range(0, 6000, 7)) + list(range(6000, 6100))
    Table.open(path, options).upsert(pa.table({
        "id": [f"k{i:06d}" for i in update], "ts": [9] * len(update),
        "city": ["a"] * len(update), "pad": ["x"] * len(update)}))
    oracle.update({f"k{i:06d}": 9 for i in update})
    _key_reads_find_every_row(path, oracle)
