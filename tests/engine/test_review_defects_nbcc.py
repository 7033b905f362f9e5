"""Non-blocking writers that cross: a delete planned before a concurrent insert created the
key's bucket group (issue 22, item 7); a delete and an upsert of one key on a table keeping the
record index (issue 34, defect 3: refused, as Hudi allows non-blocking writers with the simple
bucket index only).

Under non-blocking concurrency control the result must be the same whichever writer commits
first: both writers' log blocks are merged by the ordering field, so the oracle applies every
event in ordering-value order.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table, WriteConflictError
from engine.config import ConcurrencyMode
from engine.errors import InvalidOptionError
from engine.index.bucket import bucket_from_file_id
from engine.layout.file_group import list_table_files
from engine.write.placement import new_bucket_file_id
from engine.write.write_client import DELETE, UPSERT, WriteClient
from tests.helpers import hudi_rs_read, rows_by_key

VALUES = ("ts", "v")

Event = tuple[str, str, int, int | None]
"""(op, key, ordering value, v): ``upsert`` or ``delete``."""


def _oracle(events: list[Event]) -> dict[str, tuple[int, int]]:
    """Apply events in ordering-value order (event-time ordering; later wins ties)."""
    state: dict[str, tuple[int, int]] = {}
    for op, key, ts, v in sorted(events, key=lambda e: e[2]):
        if op == "delete":
            state.pop(key, None)
        else:
            assert v is not None
            state[key] = (ts, v)
    return state


def _nbcc_table(tmp_path: Path) -> Table:
    table = Table.create(str(tmp_path / "t"), name="nbcc", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts", partition_by=["part"],
                         options={"hoodie.index.type": "BUCKET"})
    assert WriteClient(table.storage, table.config, table.write_config).log_only_inserts
    return table


def _client(table: Table, options: dict[str, str] | None = None) -> WriteClient:
    opened = Table.open(table.path, options)
    return WriteClient(opened.storage, opened.config, opened.write_config)


def _stage(client: WriteClient, operation: str, data: pa.Table):  # type: ignore[no-untyped-def]
    """Begin an instant and write its files without committing: (timeline, plan, stats)."""
    timeline, inflight = client.begin()
    if operation == DELETE:
        records, deletes = None, client.prepare_deletes(data, timeline)
    else:
        records, deletes = client.prepare(data, timeline, dedupe=True)
    plan = client.plan(timeline, inflight, operation, records, deletes)
    return timeline, plan, client.execute_local(plan)


@pytest.mark.parametrize("delete_commits_first", [False, True])
def test_nbcc_delete_planned_before_concurrent_insert_created_bucket_key_deleted(
        tmp_path: Path, delete_commits_first: bool) -> None:
    table = _nbcc_table(tmp_path)
    table.upsert(pa.table({"key": ["a"], "ts": [1], "part": ["p1"], "v": [0]}))
    # Partition p0 has no file group yet: the delete of k0 finds no bucket group there.
    deleter, inserter = _client(table), _client(table)
    d_start, d_plan, d_stats = _stage(deleter, DELETE, pa.table(
        {"key": ["k0"], "ts": [9], "part": ["p0"]}))
    i_start, i_plan, i_stats = _stage(inserter, UPSERT, pa.table(
        {"key": ["k0", "k1"], "ts": [5, 5], "part": ["p0", "p0"], "v": [1, 1]}))
    if delete_commits_first:
        deleter.commit(d_start, d_plan, d_stats)
        inserter.commit(i_start, i_plan, i_stats)
    else:
        inserter.commit(i_start, i_plan, i_stats)
        deleter.commit(d_start, d_plan, d_stats)

    expected = _oracle([("upsert", "a", 1, 0), ("upsert", "k0", 5, 1), ("upsert", "k1", 5, 1),
                        ("delete", "k0", 9, None)])
    assert expected == {"a": (1, 0), "k1": (5, 1)}
    assert rows_by_key(table.read(), "key", VALUES) == expected
    assert rows_by_key(hudi_rs_read(table.path), "key", VALUES) == expected
    # Both writers addressed the bucket's one deterministic group.
    (group,) = {s.file_id for s in d_stats}
    assert group in {s.file_id for s in i_stats}
    assert group == new_bucket_file_id("nbcc", "p0", bucket_from_file_id(group))
    assert list_table_files(table.storage).base_files == ()


# -- non-blocking writers and the record index (issue 34, defect 3) ------------------------

RECORD_INDEX_ON = {"hoodie.metadata.enable": "true",
                   "hoodie.metadata.record.index.enable": "true"}
NBCC = {"hoodie.write.concurrency.mode": "NON_BLOCKING_CONCURRENCY_CONTROL"}
REFUSED = r"hoodie\.write\.concurrency\.mode.*hoodie\.index\.type"


def _record_index_table(tmp_path: Path) -> Table:
    """A MERGE_ON_READ bucket table whose metadata table keeps the record_index, written
    once by an optimistic writer: keys ``k`` and ``j`` at ts 1."""
    table = Table.create(str(tmp_path / "t"), name="nbcc", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "BUCKET"})
    Table.open(table.path, {**RECORD_INDEX_ON, "hoodie.write.concurrency.mode":
                            "OPTIMISTIC_CONCURRENCY_CONTROL"}).upsert(
        pa.table({"key": ["k", "j"], "ts": [1, 1], "v": [0, 0]}))
    return table


def _race(deleter: WriteClient, upserter: WriteClient, delete_commits_first: bool) -> None:
    """A delete of ``k`` at ts 5 and an upsert of it at ts 10, both staged before either
    commits."""
    staged_delete = _stage(deleter, DELETE, pa.table({"key": ["k"], "ts": [5]}))
    staged_upsert = _stage(upserter, UPSERT, pa.table({"key": ["k"], "ts": [10], "v": [1]}))
    if delete_commits_first:
        deleter.commit(*staged_delete)
        upserter.commit(*staged_upsert)
    else:
        upserter.commit(*staged_upsert)
        deleter.commit(*staged_delete)


def _assert_untouched(table: Table) -> None:
    assert [e.instant_time for e in table.timeline() if e.state != "completed"] == []
    assert rows_by_key(table.read(), "key", VALUES) == {"k": (1, 0), "j": (1, 0)}
    assert table.validate_metadata().ok


@pytest.mark.parametrize("delete_commits_first", [False, True])
def test_nbcc_with_record_index_refused_before_any_instant(
        tmp_path: Path, delete_commits_first: bool) -> None:
    table = _record_index_table(tmp_path)
    # Each non-blocking writer computes its record_index entries from its own snapshot: the
    # delete removes k's entry, the upsert finds k live (an update in place: no entry), and
    # k, live at ts 10, is left out of the index whichever commits first.
    with pytest.raises(InvalidOptionError, match=REFUSED):
        deleter = _client(table, {**NBCC, **RECORD_INDEX_ON})
        upserter = _client(table, {**NBCC, **RECORD_INDEX_ON})
        _race(deleter, upserter, delete_commits_first)
        full = rows_by_key(table.read(), "key", VALUES)
        assert full["k"] == (10, 1)
        assert rows_by_key(table.read(filters=[("key", "=", "k")]), "key", VALUES) == \
            {"k": full["k"]}, "a key-filtered read misses the live key"
    _assert_untouched(table)


def test_nbcc_writer_keeping_the_table_record_index_refused_at_open_and_begin(
        tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="nbcc", table_type="MERGE_ON_READ",
                         record_key="key", precombine="ts",
                         options={"hoodie.index.type": "BUCKET"})
    # opened (metadata kept, the record index option unset: keep what the table has) while
    # the table keeps no record_index ...
    early = _client(table, {**NBCC, "hoodie.metadata.enable": "true"})
    Table.open(table.path, {**RECORD_INDEX_ON, "hoodie.write.concurrency.mode":
                            "OPTIMISTIC_CONCURRENCY_CONTROL"}).upsert(
        pa.table({"key": ["k", "j"], "ts": [1, 1], "v": [0, 0]}))
    # ... it begins once the table keeps one: refused before its instant exists
    with pytest.raises(InvalidOptionError, match=REFUSED):
        early.begin()
    _assert_untouched(table)
    with pytest.raises(InvalidOptionError, match=REFUSED):
        Table.open(table.path, {**NBCC, "hoodie.metadata.enable": "true"})
    # a non-blocking writer that drops the index (or the metadata table) may write
    Table.open(table.path, {**NBCC, "hoodie.metadata.enable": "true",
                            "hoodie.metadata.record.index.enable": "false"}).upsert(
        pa.table({"key": ["j"], "ts": [2], "v": [2]}))
    assert rows_by_key(table.read(), "key", VALUES) == {"k": (1, 0), "j": (2, 2)}
    assert table.validate_metadata().ok


@pytest.mark.parametrize("delete_commits_first", [False, True])
def test_default_mode_with_record_index_optimistic_race_refuses_second_commit(
        tmp_path: Path, delete_commits_first: bool) -> None:
    table = _record_index_table(tmp_path)
    deleter, upserter = _client(table, RECORD_INDEX_ON), _client(table, RECORD_INDEX_ON)
    assert deleter.mode is ConcurrencyMode.OPTIMISTIC_CONCURRENCY_CONTROL
    with pytest.raises(WriteConflictError):
        _race(deleter, upserter, delete_commits_first)
    expected = {"j": (1, 0)} if delete_commits_first else {"k": (10, 1), "j": (1, 0)}
    assert rows_by_key(table.read(), "key", VALUES) == expected
    assert rows_by_key(hudi_rs_read(table.path), "key", VALUES) == expected
    assert rows_by_key(table.read(filters=[("key", "=", "k")]), "key", VALUES) == \
        {k: v for k, v in expected.items() if k == "k"}
    assert [e.instant_time for e in table.timeline() if e.state != "completed"] == []
    assert table.validate_metadata().ok
