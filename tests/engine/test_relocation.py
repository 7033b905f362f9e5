"""Where the keys of replaced file groups went (``engine/index/relocation.py``).

The oracle is the table itself, read by the snapshot reader: the file each key's row is in
(``_hoodie_file_name``) before and after clusterings; deletes are the writer's own list.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa

from engine import Table
from engine.format.naming import parse_base_file
from engine.index.relocation import FileGroupLineage, MovedKeys
from engine.timeline.active import Timeline

SCHEMA = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("part", pa.string()),
                    ("v", pa.int64())])


def _locations(table: Table) -> dict[str, tuple[str, str]]:
    """key → (partition, file id) of its row in the snapshot."""
    data = table.read(columns=["key", "_hoodie_partition_path", "_hoodie_file_name"])
    found = {}
    for row in data.to_pylist():
        name = parse_base_file(row["_hoodie_file_name"])
        # a row last written to a log names its file group (as Hudi's log records do)
        file_id = row["_hoodie_file_name"] if name is None else name.file_id
        assert row["key"] not in found, f"{row['key']} stored twice"
        found[row["key"]] = (row["_hoodie_partition_path"], file_id)
    return found


def _insert(table: Table, rng: random.Random, keys: list[str], ts: int) -> None:
    rows = [{"key": k, "ts": ts, "part": "p" + str(int(k[1:]) % 2), "v": rng.randint(0, 99)}
            for k in keys]
    table.bulk_insert(pa.Table.from_pylist(rows, schema=SCHEMA))


def _upsert(table: Table, rng: random.Random, keys: list[str], ts: int) -> None:
    rows = [{"key": k, "ts": ts, "part": "p" + str(int(k[1:]) % 2), "v": rng.randint(0, 99)}
            for k in keys]
    table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))


def _check(table: Table, before: dict[str, tuple[str, str]],
           deleted: dict[str, str | None]) -> None:
    """Every key's old location resolves to where the snapshot has it now; a deleted key to
    ``deleted[key]`` (None: deleted before the clustering that would have moved it; else
    the group it was moved to, whose base file still has it under the delete)."""
    timeline = Timeline.load(table.storage, table.config)
    lineage = FileGroupLineage.of(timeline)
    moved = MovedKeys(table.storage)
    now = _locations(table)
    by_group: dict[tuple[str, str], list[str]] = {}
    for key, loc in before.items():
        by_group.setdefault(loc, []).append(key)
    for (partition, file_id), keys in sorted(by_group.items()):
        found = moved.locate(timeline, lineage, partition, file_id, keys)
        expected = [deleted[k] if k in deleted else now[k][1] for k in keys]
        if not lineage.is_replaced(partition, file_id):
            expected = [file_id] * len(keys)  # a live group answers for itself
        assert found == expected, (partition, file_id)


def test_keys_followed_through_chained_clusterings(tmp_path: Path) -> None:
    rng = random.Random(3)
    table = Table.create(str(tmp_path / "t"), name="t", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by="part",
                         options={"hoodie.clean.automatic": "false"})
    for n in range(3):
        _insert(table, rng, [f"k{i}" for i in range(n * 50, n * 50 + 50)], 1)
    _upsert(table, rng, [f"k{i}" for i in range(0, 150, 7)], 2)  # logs on top
    first = _locations(table)
    assert len({loc for loc in first.values()}) == 6
    assert not FileGroupLineage.of(Timeline.load(table.storage, table.config))

    table.delete(pa.table({"key": ["k3", "k79"], "part": ["p1", "p1"]}))
    table.cluster()
    deleted: dict[str, str | None] = {"k3": None, "k79": None}
    _check(table, first, deleted)
    second = _locations(table)
    assert not set(second.values()) & set(first.values())
    table.delete(pa.table({"key": ["k5"], "part": ["p1"]}))  # a delete block on top
    deleted["k5"] = second.pop("k5")[1]
    _check(table, first, deleted)

    # new small groups, clustered with the first clustering's output: a chain
    _insert(table, rng, [f"k{i}" for i in range(150, 200)], 3)
    _upsert(table, rng, [f"k{i}" for i in range(0, 200, 11)], 4)
    table.cluster()
    lineage = FileGroupLineage.of(Timeline.load(table.storage, table.config))
    assert all(lineage.is_replaced(*loc) for loc in second.values())
    third = _locations(table)
    deleted["k5"] = None  # the second clustering merged the delete
    _check(table, first, deleted)
    _check(table, second, deleted)
    assert len(set(third.values())) < len(set(second.values())) + 2
    assert MovedKeys(table.storage).locate(
        Timeline.load(table.storage, table.config), lineage, *first["k0"],
        ["never-written"]) == [None]


def test_keys_found_after_clustering_files_are_cleaned_and_archived(tmp_path: Path) -> None:
    """The clustering's own base files cleaned (newer versions of the groups exist) and its
    replacecommit archived: the lineage still knows it, and the newest base files answer."""
    rng = random.Random(5)
    table = Table.create(str(tmp_path / "t"), name="t", table_type="COPY_ON_WRITE",
                         record_key="key", precombine="ts", partition_by="part",
                         options={"hoodie.clean.commits.retained": "1",
                                  "hoodie.keep.min.commits": "2",
                                  "hoodie.keep.max.commits": "3"})
    for n in range(3):
        _insert(table, rng, [f"k{i}" for i in range(n * 40, n * 40 + 40)], 1)
    first = _locations(table)
    run = table.cluster()
    replacecommit = run.completed[0]
    written = {s.base_file.path for s in table.file_slices() if s.base_file}
    for ts in range(2, 9):  # every group rewritten, then cleaned and archived
        _upsert(table, rng, [f"k{i}" for i in range(120)], ts)
    timeline = Timeline.load(table.storage, table.config)
    assert replacecommit in timeline.archived()
    assert not any(table.storage.exists(p) for p in written)
    _check(table, first, {})
