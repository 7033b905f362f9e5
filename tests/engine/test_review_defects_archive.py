"""Archival beside writers and the cleaner (issue 22, items 5 and 6).

Item 5: a commit that completed while another instant was in flight must stay on the active
timeline until that instant ends — the writer's conflict check and a clustering's carry-over
look for it there. Item 6: a replacecommit leaves the active timeline only after the cleaner
deleted the file groups it replaced (hudi-rs, which reads no history, would read them as
live), whichever order writes, cleans and archivals run in; time travel within the cleaner's
retention stays whole.

Every snapshot is compared with an oracle (key → (ordering value, v), applied in commit
order; each write has a higher ordering value than the last) through our reader and
hudi-rs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import Table, WriteConflictError
from engine.layout.file_group import list_table_files
from engine.services.base import local_runner
from engine.services.clean import earliest_readable_instant
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import WriteStat
from engine.write.write_client import UPSERT, WriteClient, WritePlan
from tests.helpers import Oracle, hudi_rs_read, rows_by_key

VALUES = ("ts", "v")
"""What each key holds, as the tests compare it: (ordering value, v)."""

SMALL_ARCHIVE = {"hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "3",
                 "hoodie.clean.automatic": "false", "hoodie.archive.automatic": "false"}
"""Archival due after a few commits; services run by the tests only."""


def _check(table: Table, oracle: Oracle) -> None:
    """Our snapshot and hudi-rs's equal the oracle's, each key once."""
    expected = rows_by_key(oracle.snapshot(), "key", VALUES)
    for reader, read in (("ours", table.read()), ("hudi-rs", hudi_rs_read(table.path))):
        assert (reader, rows_by_key(read, "key", VALUES), read.num_rows) == \
            (reader, expected, len(expected))


def _batch(keys: Sequence[str], ts: int, part: str) -> pa.Table:
    return pa.table({"key": list(keys), "ts": [ts] * len(keys), "part": [part] * len(keys),
                     "v": [ts * 100 + i for i in range(len(keys))]})


def _table(tmp_path: Path, **options: str) -> Table:
    return Table.create(str(tmp_path / "t"), name="arch", table_type="COPY_ON_WRITE",
                        record_key="key", precombine="ts", partition_by=["part"],
                        options={**SMALL_ARCHIVE, **options})


def _client(table: Table) -> WriteClient:
    opened = Table.open(table.path)
    return WriteClient(opened.storage, opened.config, opened.write_config)


Staged = tuple[WriteClient, Any, WritePlan, list[WriteStat]]


def _stage(table: Table, data: pa.Table) -> Staged:
    """Begin an instant and write its files without committing."""
    client = _client(table)
    timeline, inflight = client.begin()
    records, deletes = client.prepare(data, timeline, dedupe=True)
    plan = client.plan(timeline, inflight, UPSERT, records, deletes)
    return client, timeline, plan, client.execute_local(plan)


def _commit(staged: Staged) -> str:
    client, timeline, plan, stats = staged
    return client.commit(timeline, plan, stats).requested_time


def _active(table: Table) -> set[str]:
    return {e.instant_time for e in table.timeline()}


# -- item 5: a commit that completed while an instant was in flight stays ----------------------


def test_archive_commit_completed_during_inflight_write_kept_conflict_refused(
        tmp_path: Path) -> None:
    table = _table(tmp_path)
    oracle = Oracle(ordering=None)  # applied in commit order
    first = _batch(["a0", "a1", "a2"], 1, "p0")  # one file group in p0
    oracle.upsert(first, table.upsert(first))
    long_writer = _stage(table, _batch(["a0"], 2, "p0"))  # O: a backfill, say
    for ts in (3, 4, 5):  # a streaming job's commits on p1
        batch = _batch(["b0"], ts, "p1")
        oracle.upsert(batch, table.upsert(batch))
    optimistic = _stage(table, _batch(["a1"], 6, "p0"))  # T merges the group O merges
    o_batch = _batch(["a0"], 2, "p0")
    o_instant = _commit(long_writer)
    oracle.upsert(o_batch, o_instant)

    run = table.archive()  # O completed after T started: T's conflict check needs it
    try:  # refused, or (old code) it commits and its merge drops O's update
        oracle.upsert(_batch(["a1"], 6, "p0"), _commit(optimistic))
        refused = None
    except WriteConflictError as exc:
        refused = exc
    _check(table, oracle)
    assert refused is not None and o_instant in str(refused)
    assert o_instant not in run.completed and o_instant in _active(table)
    assert rows_by_key(oracle.snapshot(), "key", VALUES)["a0"] == (2, 200)  # O's update survived


def test_archive_commit_completed_during_clustering_kept_carried_over(tmp_path: Path) -> None:
    table = _table(tmp_path, **{"hoodie.clustering.plan.strategy.sort.columns": "v"})
    oracle = Oracle(ordering=None)  # applied in commit order
    first = _batch(["a0", "a1", "a2"], 1, "p0")
    oracle.upsert(first, table.upsert(first))
    writer = _stage(table, _batch(["a0"], 2, "p0"))  # W, in flight when C is scheduled
    for ts in (3, 4, 5):
        batch = _batch(["b0"], ts, "p1")
        oracle.upsert(batch, table.upsert(batch))
    w_instant: list[str] = []
    archived: list[str] = []

    def runner(fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        out = local_runner(fn, tasks)
        if not w_instant:  # C read its inputs; W completes on one of them, archival runs
            w_instant.append(_commit(writer))
            oracle.upsert(_batch(["a0"], 2, "p0"), w_instant[0])
            archived.extend(table.archive().completed)
        return out

    run = table.cluster(runner=runner)
    assert run.completed, "the clustering must commit"
    _check(table, oracle)
    assert rows_by_key(oracle.snapshot(), "key", VALUES)["a0"] == (2, 200)
    assert archived, "archival was due"
    assert w_instant[0] not in archived
    assert run.details["carried_over_groups"] >= 1


# -- item 6: a replacecommit is archived only after its replaced groups were cleaned -----------


@pytest.mark.parametrize("policy", ["KEEP_LATEST_COMMITS", "KEEP_LATEST_FILE_VERSIONS"])
def test_archive_replacecommit_only_after_cleaner_deleted_replaced_groups(
        tmp_path: Path, policy: str) -> None:
    table = _table(tmp_path, **{
        "hoodie.clustering.plan.strategy.sort.columns": "v",
        "hoodie.cleaner.policy": policy, "hoodie.cleaner.commits.retained": "3",
        "hoodie.cleaner.fileversions.retained": "1"})
    oracle = Oracle(ordering=None)  # applied in commit order
    for ts in (1, 2):
        batch = _batch(["a0", "a1", "a2"], ts, "p0")
        oracle.upsert(batch, table.upsert(batch))
    replaced = {f.path for f in list_table_files(table.storage).base_files}
    ts = [10]
    clustering: list[str] = []

    def step(archive_first: bool) -> None:
        """One write on p1, then archival and clean in either order; after each service
        the rule and the reads are checked."""
        ts[0] += 1
        batch = _batch(["b0", f"b{ts[0]}"], ts[0], "p1")
        oracle.upsert(batch, table.upsert(batch))
        services = [table.archive, table.clean]
        for service in services if archive_first else services[::-1]:
            service()
            _check(table, oracle)
            _check_rule(table, clustering, replaced)
            _check_time_travel(table, oracle)

    def runner(fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        out = local_runner(fn, tasks)
        if not clustering:
            clustering.append("running")
            for _ in range(3):  # writes, cleans and archivals while the clustering runs
                step(archive_first=False)
        return out

    run = table.cluster(runner=runner)
    (clustering[0],) = run.completed
    for n in range(10):
        step(archive_first=n % 2 == 0)
    # It does leave eventually: once the cleaner passed it.
    assert clustering[0] not in _active(table)
    assert not any(Path(table.path, rel).exists() for rel in replaced)


def _check_rule(table: Table, clustering: list[str], replaced: set[str]) -> None:
    """A replacecommit off the active timeline has no replaced file left on storage."""
    if clustering and clustering[0] != "running" and clustering[0] not in _active(table):
        left = sorted(rel for rel in replaced if Path(table.path, rel).exists())
        assert not left, f"replacecommit {clustering[0]} archived, replaced files left: {left}"


def _check_time_travel(table: Table, oracle: Oracle) -> None:
    """Every view the cleaner left readable is whole (our reader)."""
    floor = earliest_readable_instant(Timeline.load(table.storage, table.config)) or ""
    for instant in oracle.instants:
        if instant >= floor:
            rows = rows_by_key(oracle.snapshot(instant), "key", VALUES)
            assert rows_by_key(table.read(as_of=instant), "key", VALUES) == rows, \
                f"as of {instant}"
