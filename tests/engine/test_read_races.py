"""A read racing the cleaner (issue 34, defect 12, the reader's half).

Each test plans a read (``Table.scan`` / ``scan_incremental``: the plan holds the files it will
read), then runs the real cleaner (``Table.clean``, engine/services/clean.py) after compactions
or commits so that it deletes files the plan holds — checked on disk — and only then executes
the plan: the read re-plans once on the reloaded timeline and succeeds, or raises
``InstantNotReadableError`` (its instant is outside what the cleaner keeps now) or
``CorruptTableError`` (a committed file the cleaner keeps was deleted by hand); never the
storage's ``FileNotFoundError``. The executor path (a pickled ``SliceScan`` reading one slice,
as ``spark.read.format("tidelake")`` tasks do) cannot re-plan and must raise the same errors.
Expected rows come from the Oracle (tests/helpers.py), not from the engine.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from engine import InstantNotReadableError, Table
from engine.errors import CorruptTableError
from engine.read.scan import Scan
from tests.helpers import COMMIT_TIME, Oracle, hudi_rs_read, sorted_rows

COLUMNS = ["k", "ts", "p", "v", COMMIT_TIME]


def _create(path: Path, table_type: str, retained: int = 1) -> Table:
    return Table.create(str(path), name="t", table_type=table_type, record_key="k",
                        precombine="ts", partition_by="p",
                        options={"hoodie.clean.automatic": "false",
                                 "hoodie.archive.automatic": "false",
                                 "hoodie.compact.inline": "false",
                                 "hoodie.cleaner.commits.retained": str(retained)})


def _commit(table: Table, oracle: Oracle, step: int, keys: int = 4) -> str:
    batch = [{"k": f"k{j}", "ts": step, "p": f"p{j % 2}", "v": step * 10 + j}
             for j in range(keys)]
    instant = table.upsert(pa.Table.from_pylist(batch))
    oracle.upsert(batch, instant)
    return instant


def _planned_files(scan: Scan, root: Path) -> list[Path]:
    files = []
    for slc in scan.slices:
        if slc.base_file is not None:
            files.append(root / slc.base_file.path)
        files += [root / log.path for log in slc.log_files]
    return files


def _clean_away(table: Table, oracle: Oracle, scan: Scan, root: Path, first_step: int) -> None:
    """Commit (and compact, on MOR) until a clean deletes a file ``scan`` planned."""
    step = first_step
    for _ in range(4):
        _commit(table, oracle, step)
        step += 1
        if table.config.table_type.value == "MERGE_ON_READ":
            table.compact()
        _commit(table, oracle, step)
        step += 1
        table.clean()
        if any(not f.exists() for f in _planned_files(scan, root)):
            return
    raise AssertionError("the cleaner deleted no planned file")


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_snapshot_planned_before_a_clean_replans_and_reads_the_latest_rows(
        tmp_path: Path, table_type: str) -> None:
    root = tmp_path / "t"
    table = _create(root, table_type)
    oracle = Oracle(key="k")
    for step in range(3):
        _commit(table, oracle, step)
    scan = table.scan()  # holds the slices of this snapshot (MOR: base + log files)
    _clean_away(table, oracle, scan, root, 3)
    rows = scan.to_table()
    assert sorted_rows(rows, COLUMNS, key="k") == oracle.snapshot(oracle.instants[-1])
    assert sorted_rows(hudi_rs_read(root), COLUMNS, key="k") == oracle.snapshot()


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_incremental_read_planned_before_a_clean_raises_instant_not_readable(
        tmp_path: Path, table_type: str) -> None:
    """The issue's stream: an incremental read planned just before a clean completed."""
    root = tmp_path / "t"
    table = _create(root, table_type)
    oracle = Oracle(key="k")
    start = _commit(table, oracle, 0)
    for step in range(1, 3):
        _commit(table, oracle, step)
    scan = table.scan_incremental(start)
    executor_copy = pickle.loads(pickle.dumps(scan.slice_scan))  # what a Spark task gets
    _clean_away(table, oracle, scan, root, 3)
    with pytest.raises(InstantNotReadableError, match=f"from {start}") as caught:
        scan.to_table()
    assert caught.value.earliest > start
    # A Spark task reads one slice and cannot re-plan: it names the same error.
    gone = next(s for s in scan.slices
                if any(not f.exists() for f in _planned_files(Scan(scan.slice_scan, [s]), root)))
    with pytest.raises(InstantNotReadableError, match="which it planned, is gone"):
        executor_copy.read(gone)


def test_time_travel_planned_before_a_clean_raises_instant_not_readable(
        tmp_path: Path) -> None:
    root = tmp_path / "t"
    table = _create(root, "MERGE_ON_READ")
    oracle = Oracle(key="k")
    instants = [_commit(table, oracle, step) for step in range(3)]
    scan = table.scan(as_of=instants[1])
    _clean_away(table, oracle, scan, root, 3)
    with pytest.raises(InstantNotReadableError, match=f"time travel as of {instants[1]}"):
        scan.to_table()


def test_snapshot_slice_read_by_an_executor_after_a_clean_names_the_cleaner(
        tmp_path: Path) -> None:
    """The Spark source's tasks read pickled ``SliceScan``s: a snapshot planned before the
    clean cannot be re-planned there, so it fails with the table's error, not the store's."""
    root = tmp_path / "t"
    table = _create(root, "MERGE_ON_READ")
    oracle = Oracle(key="k")
    for step in range(3):
        _commit(table, oracle, step)
    scan = table.scan()
    executor_copy = pickle.loads(pickle.dumps(scan.slice_scan))
    _clean_away(table, oracle, scan, root, 3)
    errors = []
    for slc in scan.slices:
        try:
            executor_copy.read(slc)
        except InstantNotReadableError as exc:
            errors.append(exc)
    assert errors and all("plan the read again" in str(e) for e in errors)


@pytest.mark.parametrize("kind", ["snapshot", "time-travel", "incremental"])
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_committed_file_deleted_by_hand_inside_retention_raises_corrupt_table(
        tmp_path: Path, table_type: str, kind: str) -> None:
    """No clean ran: a file of the latest commit is gone, so re-planning finds it again and
    the read says the table is damaged, naming the file."""
    root = tmp_path / "t"
    table = _create(root, table_type, retained=10)
    oracle = Oracle(key="k")
    instants = [_commit(table, oracle, step) for step in range(3)]
    table.clean()
    if kind == "snapshot":
        scan = table.scan()
    elif kind == "time-travel":
        scan = table.scan(as_of=instants[-1])
    else:
        scan = table.scan_incremental(instants[0])
    newest = max(_planned_files(scan, root), key=lambda f: f.name.rsplit("_", 1)[-1])
    if table_type == "MERGE_ON_READ":  # a log file of the latest deltacommit
        newest = next(f for f in _planned_files(scan, root)
                      if ".log." in f.name and instants[-1] in f.name)
    os.remove(newest)
    with pytest.raises(CorruptTableError, match=newest.name):
        scan.to_table()
    with pytest.raises(CorruptTableError, match="deleted by something other"):
        table.read()


def test_read_without_a_race_is_unchanged_and_commit_times_kept(tmp_path: Path) -> None:
    """The re-plan hook is only a fallback: a read with all files present returns the plan's
    rows (the commit times of its snapshot, not a newer one)."""
    root = tmp_path / "t"
    table = _create(root, "MERGE_ON_READ", retained=10)
    oracle = Oracle(key="k")
    first = _commit(table, oracle, 0)
    scan = table.scan()
    _commit(table, oracle, 1)  # after the plan: not in its rows
    rows = scan.to_table()
    assert set(rows.column(COMMIT_TIME).cast(pa.string()).to_pylist()) == {first}
