"""Non-blocking writers that cross: a delete planned before a concurrent insert created the
key's bucket group (issue 22, item 7).

Under non-blocking concurrency control the result must be the same whichever writer commits
first: both writers' log blocks are merged by the ordering field, so the oracle applies every
event in ordering-value order.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
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


def _client(table: Table) -> WriteClient:
    opened = Table.open(table.path)
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
