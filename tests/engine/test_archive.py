"""Archival into the v8 LSM history, and reads over archived instants.

Every snapshot is compared with an oracle (a dict applying the upserts in order; each
batch has fresh, increasing ordering values so the later write always wins) and with
hudi-rs; time travel and incremental reads over archived instants are compared with the
oracle's state as of that instant.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import InstantNotReadableError, Table
from engine.layout.file_group import list_table_files
from engine.services import archive as archive_mod
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import CommitMetadata
from engine.timeline.history import HISTORY_SCHEMA, LSMHistory
from engine.timeline.instant import new_instant_time
from tests.helpers import COMMIT_TIME, Oracle, hudi_rs_read, sorted_rows

HISTORY = ".hoodie/timeline/history"
TL = ".hoodie/timeline"
COLUMNS = ["key", "ts", "region", "amount", COMMIT_TIME]



MANUAL = {"hoodie.clean.automatic": "false", "hoodie.archive.automatic": "false"}
"""Services run by the tests themselves, never after writes."""

def _make(tmp_path: Path, table_type: str, commits: int, **options: Any) -> tuple[Table,
                                                                                   Oracle]:
    opts = {"hoodie.keep.min.commits": "20", "hoodie.keep.max.commits": "30", **MANUAL,
            **options}
    table = Table.create(str(tmp_path / "t"), name="arch", record_key="key", precombine="ts",
                         partition_by="region", table_type=table_type, options=opts)
    oracle = Oracle(ordering=None)  # each write here is newer than the last
    for n in range(commits):
        keys = [(n * 3 + j) % 25 for j in range(3)]  # a key keeps its partition
        batch = [{"key": f"k{k:03d}", "ts": n * 10 + j, "region": ["north", "south"][k % 2],
                  "amount": float(n)} for j, k in enumerate(keys)]
        oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch)))
    return table, oracle


def _check_snapshot(table: Table, oracle: Oracle) -> None:
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot()
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == oracle.snapshot()


def _history_rows(table: Table) -> list[str]:
    """instantTime of every row of every file the latest manifest lists."""
    history = LSMHistory(table.storage, HISTORY)
    times: list[str] = []
    for entry in history.manifest():
        times += pq.read_table(table.storage.full(f"{HISTORY}/{entry.name}"),
                               columns=["instantTime"]).column(0).to_pylist()
    return times


def _completed_commits(table: Table) -> list[str]:
    return [e.instant_time for e in table.timeline()
            if e.state == "completed" and e.action in ("commit", "deltacommit",
                                                       "replacecommit")]


def test_archive_cow_42_commits_history_well_formed_and_reads_match(tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 42)
    before = {e.instant_time: e for e in table.timeline()}
    run = table.archive()
    assert run.did_something and run.details["commits_archived"] == 22
    active = _completed_commits(table)
    assert len(active) == 20 and active == oracle.instants[22:]
    # the history: _version_, manifest_1, one L0 file with exactly the §8.3 schema
    files = sorted(p.name for p in (Path(table.path) / HISTORY).iterdir())
    l0 = f"{oracle.instants[0]}_{oracle.instants[21]}_0.parquet"
    assert files == sorted([l0, "manifest_1", "_version_"])
    assert (Path(table.path) / HISTORY / "_version_").read_bytes() == b"1"
    manifest = json.loads((Path(table.path) / HISTORY / "manifest_1").read_text())
    assert manifest == {"files": [{"fileName": l0,
                                   "fileLen": (Path(table.path) / HISTORY / l0).stat().st_size}]}
    parquet = pq.read_table(Path(table.path) / HISTORY / l0)
    assert parquet.schema.remove_metadata() == HISTORY_SCHEMA
    meta = pq.read_metadata(Path(table.path) / HISTORY / l0).metadata
    assert meta[b"writer.model.name"] == b"avro"
    assert json.loads(meta[b"parquet.avro.schema"])["name"] == "HoodieLSMTimelineInstant"
    rows = parquet.to_pylist()
    assert [r["instantTime"] for r in rows] == oracle.instants[:22]
    assert all(r["action"] == "commit" and r["version"] == 1 and r["plan"] is None
               for r in rows)
    assert [r["completionTime"] for r in rows] == [before[t].completion_time
                                                   for t in oracle.instants[:22]]
    first_meta = (Path(table.path) / TL / f"{oracle.instants[30]}_"
                  f"{before[oracle.instants[30]].completion_time}.commit").read_bytes()
    assert CommitMetadata.from_bytes(rows[0]["metadata"]).write_stats
    assert first_meta[:4] == rows[0]["metadata"][:4] == b"Obj\x01"
    # no active file of an archived instant is left
    left = [p.name for p in (Path(table.path) / TL).iterdir()
            if p.name[:17] in set(oracle.instants[:22])]
    assert left == []
    # reads: snapshot, time travel and incremental over archived instants
    _check_snapshot(table, oracle)
    for t in (oracle.instants[4], oracle.instants[21], oracle.instants[25]):
        assert sorted_rows(table.read(as_of=t), COLUMNS) == oracle.snapshot(t)
    start, end = before[oracle.instants[5]].completion_time, \
        before[oracle.instants[12]].completion_time
    in_range = set(oracle.instants[6:13])
    want = [r for r in oracle.snapshot(oracle.instants[12])
            if r["_hoodie_commit_time"] in in_range]
    assert want and sorted_rows(table.read_incremental(start, end), COLUMNS) == want
    # the timeline with archived instants equals the one before archival (completed ones)
    full = table.timeline(include_archived=True)
    assert [(e.instant_time, e.completion_time) for e in full if e.action == "commit"] == \
        [(t, before[t].completion_time) for t in oracle.instants]
    # nothing more is due; another run changes nothing
    assert not table.archive().did_something


def test_archive_mor_keeps_deltacommits_with_live_logs_until_compacted_and_cleaned(
        tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "MERGE_ON_READ", 42,
                          **{"hoodie.cleaner.commits.retained": "3"})
    live = {f.instant_time for f in list_table_files(table.storage).log_files}
    assert len(live) > 30, "the test needs many deltacommits with log files"
    first = table.archive()
    assert not set(first.completed) & live  # never archived while its logs exist
    assert _completed_commits(table)[0] <= min(live)
    table.compact()
    for n in range(4):  # the cleaner's retained commits move past the compaction
        batch = [{"key": f"k{n:03d}", "ts": 5_000 + n, "region": ["north", "south"][n % 2],
                  "amount": 0.5}]
        oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch)))
    cleaned = table.clean()
    assert cleaned.details["files_deleted"] > 0
    still = {f.instant_time for f in list_table_files(table.storage).log_files}
    run = table.archive()
    assert run.details["commits_archived"] > 0
    assert not set(run.completed) & still
    assert len(_completed_commits(table)) <= 30
    _check_snapshot(table, oracle)
    # a write after archival updates records whose latest version is in compacted files
    batch = [{"key": "k000", "ts": 10_000, "region": "north", "amount": -1.0}]
    oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch)))
    _check_snapshot(table, oracle)


def test_archive_instants_older_than_active_timeline_without_history_read_as_completed(
        tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "MERGE_ON_READ", 35)
    table.archive()
    for p in (Path(table.path) / HISTORY).iterdir():  # as if archived by an older writer
        p.unlink()
    _check_snapshot(table, oracle)


def _pending(table: Table, after: str, action: str = "commit") -> str:
    """A requested instant 1 ms after ``after`` (a stuck writer or plan)."""
    t = str(int(after) + 1)
    (Path(table.path) / TL / f"{t}.{action}.requested").write_bytes(b"")
    return t


def test_archive_pending_instant_blocks_archival_past_it(tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 12, **{
        "hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "4"})
    pending = _pending(table, oracle.instants[3], "clustering")
    assert pending < oracle.instants[4]
    run = table.archive()
    # the newest completed commit before the pending one (instants[3]) stays, and all after
    assert sorted(run.completed) == oracle.instants[:3]
    assert _completed_commits(table) == oracle.instants[3:]
    assert not table.archive().did_something
    _check_snapshot(table, oracle)


def _savepoint(table: Table, instant: str) -> None:
    folder = Path(table.path) / TL
    (folder / f"{instant}.savepoint.inflight").write_bytes(b"")
    (folder / f"{instant}_{new_instant_time()}.savepoint").write_bytes(b"")


def test_archive_stops_at_first_savepoint(tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 12, **{
        "hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "4"})
    _savepoint(table, oracle.instants[5])
    run = table.archive()
    assert sorted(run.completed) == oracle.instants[:5]
    assert _completed_commits(table) == oracle.instants[5:]


def test_archive_beyond_savepoint_keeps_only_the_savepointed_commit(tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 12, **{
        "hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "4",
        "hoodie.archive.beyond.savepoint": "true"})
    _savepoint(table, oracle.instants[5])
    run = table.archive()
    # 12 commits, keep 2: 10 archived, the savepointed one skipped
    assert sorted(run.completed) == [t for t in oracle.instants[:11] if t != oracle.instants[5]]
    assert _completed_commits(table) == [oracle.instants[5], *oracle.instants[11:]]
    _check_snapshot(table, oracle)
    eighth = oracle.instants[8]
    assert sorted_rows(table.read(as_of=eighth), COLUMNS) == oracle.snapshot(eighth)


def _replacecommit(table: Table, replaced: dict[str, tuple[str, ...]]) -> str:
    """A completed replacecommit written by hand (replacing nothing that exists)."""
    t = new_instant_time()
    folder = Path(table.path) / TL
    (folder / f"{t}.replacecommit.requested").write_bytes(b"")
    (folder / f"{t}.replacecommit.inflight").write_bytes(b"")
    meta = CommitMetadata(operation_type="INSERT_OVERWRITE",
                          partition_to_replace_file_ids=replaced)
    (folder / f"{t}_{new_instant_time()}.replacecommit").write_bytes(meta.to_avro_bytes())
    return t


def _clean(table: Table, ecr: str, plan: bytes = b"") -> str:
    schema = {"type": "record", "name": "HoodieCleanMetadata",
              "namespace": "org.apache.hudi.avro.model",
              "fields": [{"name": "startCleanTime", "type": "string"},
                         {"name": "timeTakenInMillis", "type": "long"},
                         {"name": "totalFilesDeleted", "type": "int"},
                         {"name": "earliestCommitToRetain", "type": "string"}]}
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(schema),
                    [{"startCleanTime": "", "timeTakenInMillis": 0, "totalFilesDeleted": 0,
                      "earliestCommitToRetain": ecr}])
    t = new_instant_time()
    folder = Path(table.path) / TL
    (folder / f"{t}.clean.requested").write_bytes(plan)
    (folder / f"{t}.clean.inflight").write_bytes(b"")
    (folder / f"{t}_{new_instant_time()}.clean").write_bytes(buf.getvalue())
    return t


def test_archive_replacecommit_kept_until_the_cleaner_passed_it(tmp_path: Path) -> None:
    opts = {"hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "4", **MANUAL}
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 4, **opts)
    replace = _replacecommit(table, {"north": ("no-such-group-0",)})
    for n in range(6):
        batch = [{"key": f"x{n}", "ts": 1, "region": "north", "amount": 0.0}]
        oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch)))
    # no clean yet: nothing at or after the first replacecommit
    run = table.archive()
    assert sorted(run.completed) == oracle.instants[:4]
    assert replace in _completed_commits(table)
    # a clean whose ECR passed the replacecommit: it may go now; the clean is newer than
    # every commit archived, so it stays
    clean = _clean(table, oracle.instants[8])
    run = table.archive()
    assert replace in run.completed and clean not in run.completed
    # min raised to (commits after the ECR) + 2 = 3
    assert _completed_commits(table) == oracle.instants[7:]
    row = next(r for r in pq.read_table(
        table.storage.full(f"{HISTORY}/{LSMHistory(table.storage, HISTORY).manifest()[-1].name}")
    ).to_pylist() if r["instantTime"] == replace)
    assert row["action"] == "replacecommit" and row["plan"] is None
    _check_snapshot(table, oracle)


def test_archive_crash_before_deleting_active_files_next_run_no_duplicates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 12, **{
        "hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "4"})

    def crash(*_: Any) -> None:
        raise OSError("simulated crash")

    with monkeypatch.context() as m:
        m.setattr(archive_mod, "_delete_active_files", crash)
        with pytest.raises(OSError):
            table.archive()
    assert sorted(_history_rows(table)) == oracle.instants[:10]
    assert len(_completed_commits(table)) == 12
    _check_snapshot(table, oracle)  # active and history both know the instants
    run = table.archive()
    assert run.details["history_rows_written"] == 0 and run.details["commits_archived"] == 10
    assert sorted(_history_rows(table)) == oracle.instants[:10]
    assert _completed_commits(table) == oracle.instants[10:]
    _check_snapshot(table, oracle)


def test_archive_crash_before_manifest_next_run_rewrites_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 8, **{
        "hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "4"})

    def crash(*_: Any) -> None:
        raise OSError("simulated crash")

    with monkeypatch.context() as m:
        m.setattr(LSMHistory, "_publish_manifest", crash)
        with pytest.raises(OSError):
            table.archive()
    folder = Path(table.path) / HISTORY
    assert [p.name for p in folder.iterdir()] == [
        f"{oracle.instants[0]}_{oracle.instants[5]}_0.parquet"]
    _check_snapshot(table, oracle)  # the unlisted file is invisible, the active files stay
    batch = [{"key": "new", "ts": 1, "region": "south", "amount": 1.0}]
    oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch)))
    run = table.archive()  # another selection now: the stray file is cleaned up
    assert sorted(_history_rows(table)) == sorted(run.completed) == oracle.instants[:7]
    assert sorted(p.name for p in folder.iterdir()) == sorted([
        f"{oracle.instants[0]}_{oracle.instants[6]}_0.parquet", "manifest_1", "_version_"])
    _check_snapshot(table, oracle)


def test_archive_lsm_compaction_merges_level0_into_level1(tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 3, **{
        "hoodie.keep.min.commits": "1", "hoodie.keep.max.commits": "2",
        "hoodie.timeline.compaction.batch.size": "3"})
    names = []
    for n in range(5):
        run = table.archive()
        assert run.details["commits_archived"] == 2
        done = sorted(run.completed)
        names.append(f"{done[0]}_{done[-1]}_0.parquet")
        batch = [{"key": f"y{n}{j}", "ts": 1, "region": "south", "amount": 1.0}
                 for j in range(2)]
        for _ in range(2):
            oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch)))
        if n == 2:
            assert run.details["history_merges"] == 1
    history = LSMHistory(table.storage, HISTORY)
    merged = f"{names[0].split('_')[0]}_{names[2].split('_')[1]}_1.parquet"
    assert [f.name for f in history.manifest()] == [merged, names[3], names[4]]
    assert sorted(_history_rows(table)) == oracle.instants[:10]
    merged_rows = pq.read_table(table.storage.full(f"{HISTORY}/{merged}")).to_pylist()
    assert [r["instantTime"] for r in merged_rows] == oracle.instants[:6]
    # 6 snapshots (5 appends + 1 merge); the newest 3 manifests are kept, and only the
    # parquet files they list
    on_disk = sorted(p.name for p in (Path(table.path) / HISTORY).iterdir())
    assert on_disk == sorted([merged, names[3], names[4], "manifest_4", "manifest_5",
                              "manifest_6", "_version_"])
    assert (Path(table.path) / HISTORY / "_version_").read_text() == "6"
    _check_snapshot(table, oracle)
    timeline = Timeline.load(table.storage, table.config)
    assert [r.requested_time for r in timeline.archived()] == oracle.instants[:10]


def test_archive_latest_schema_falls_back_to_the_history(tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 4, **{
        "hoodie.keep.min.commits": "1", "hoodie.keep.max.commits": "2"})
    active = Timeline.load(table.storage, table.config)
    schema = active.latest_schema()
    assert schema and table.archive().details["commits_archived"] == 3
    # a timeline whose schema-bearing commits are all archived
    bare = Timeline(table.storage, table.config, [])
    assert bare.latest_schema_and_source() == (
        schema, f"{HISTORY} (instant {oracle.instants[2]})")


def test_archive_rolling_metadata_found_in_the_history(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="arch", record_key="key", precombine="ts",
                         table_type="COPY_ON_WRITE", options={**MANUAL,
                             "hoodie.keep.min.commits": "1", "hoodie.keep.max.commits": "2"})
    for n in range(4):
        extra = {"ckpt": f"v{n}"} if n < 2 else {}
        table.upsert(pa.table({"key": [f"k{n}"], "ts": [n]}), extra_metadata=extra)
    assert table.archive().details["commits_archived"] == 3
    timeline = Timeline.load(table.storage, table.config)
    assert timeline.rolling_metadata(["ckpt", "absent"]) == {"ckpt": "v1"}


def test_archive_archived_replacecommit_still_hides_its_replaced_group(tmp_path: Path) -> None:
    opts = {"hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "4", **MANUAL}
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 4, **opts)
    (victim,) = [s for s in table.file_slices() if s.partition_path == "north"][:1]
    replace = _replacecommit(table, {"north": (victim.file_id,)})
    gone = {k for k, r in oracle.rows.items() if r["region"] == "north"}
    for key in gone:
        del oracle.rows[key]
    for n in range(6):
        batch = [{"key": f"s{n}", "ts": 1, "region": "south", "amount": 0.0}]
        oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch)))
    _clean(table, oracle.instants[8])  # claims the cleaner passed it (files still there)
    run = table.archive()
    assert replace in run.completed and oracle.instants[3] in run.completed
    assert (Path(table.path) / victim.base_file.path).exists()  # type: ignore[union-attr]
    assert sorted_rows(table.read(), COLUMNS) == oracle.snapshot()
    t = oracle.instants[3]  # before the replacecommit, and before the clean's boundary
    with pytest.raises(InstantNotReadableError, match=oracle.instants[8]):
        table.read(as_of=t)


def test_archive_takes_older_cleans_along_with_their_plan(tmp_path: Path) -> None:
    table, oracle = _make(tmp_path, "COPY_ON_WRITE", 3, **{
        "hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "4"})
    clean = _clean(table, "", plan=b"the plan bytes")
    for n in range(5):
        batch = [{"key": f"c{n}", "ts": 1, "region": "south", "amount": 0.0}]
        oracle.upsert(batch, table.upsert(pa.Table.from_pylist(batch)))
    run = table.archive()
    assert sorted(run.completed) == sorted([*oracle.instants[:6], clean])
    assert not [p for p in (Path(table.path) / TL).iterdir() if p.name.startswith(clean)]
    rows = {r.requested_time: r for r in LSMHistory(table.storage, HISTORY).instants()}
    assert rows[clean].action == "clean" and rows[clean].plan == b"the plan bytes"
    assert rows[clean].metadata[:4] == b"Obj\x01"
    _check_snapshot(table, oracle)
