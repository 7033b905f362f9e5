"""Cleaning and savepoints: which files go, what stays readable, and the on-disk records.

Real-write tests compare every snapshot (and time travel within retention) with an oracle —
a dict of the rows after each commit — and with hudi-rs. The §5.2 worked example (MOR with
compactions) is built from named empty files and hand-written timeline files, since only
names and the timeline decide what a clean plans.
"""

from __future__ import annotations

import datetime as _dt
import io
import os
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from engine import InstantNotReadableError, Table
from engine.config import WriteConfig
from engine.layout.file_group import build_file_slices, list_table_files, visible_instants
from engine.services.base import local_runner
from engine.services.clean import (
    CleanerPlan,
    check_readable,
    earliest_readable_instant,
    plan_clean,
    run_clean,
)
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import CommitMetadata, avro_schema
from engine.timeline.instant import Action, Instant, State, parse_instant_time
from engine.write.write_client import WriteClient
from tests.helpers import COMMIT_TIME, Oracle, hudi_rs_read, sorted_rows

COLUMNS = ["k", "ts", "p", "v", COMMIT_TIME]


# -- helpers ---------------------------------------------------------------------------------

def _create(path: Path, table_type: str, **options: str) -> Table:
    return Table.create(str(path), name="t", table_type=table_type, record_key="k",
                        precombine="ts", partition_by="p",
                        options={"hoodie.clean.automatic": "false",
                                 "hoodie.archive.automatic": "false", **options})


def _write_commits(table: Table, oracle: Oracle, n: int, keys: int = 3) -> list[str]:
    instants = []
    for i in range(len(oracle.instants), len(oracle.instants) + n):
        batch = [{"k": f"k{j}", "ts": i, "p": f"p{j % 2}", "v": i * 10 + j}
                 for j in range(keys)]
        t = table.upsert(pa.Table.from_pylist(batch))
        oracle.upsert(batch, t)
        instants.append(t)
    return instants


def _data_files(path: Path) -> set[str]:
    found = set()
    for folder, _dirs, files in os.walk(path):
        if ".hoodie" in Path(folder).relative_to(path).parts:
            continue
        found.update(f for f in files if f != ".hoodie_partition_metadata")
    return found


def _check_snapshot(table: Table, oracle: Oracle, last: str) -> None:
    assert sorted_rows(table.read(), COLUMNS, key="k") == oracle.snapshot(last)
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS, key="k") == oracle.snapshot(last)


def _check_time_travel(table: Table, oracle: Oracle, instant: str) -> None:
    expected = oracle.snapshot(instant)
    assert sorted_rows(table.read(as_of=instant), COLUMNS, key="k") == expected
    assert sorted_rows(hudi_rs_read(table.path, as_of=instant), COLUMNS, key="k") == expected


def _client(table: Table) -> WriteClient:
    return WriteClient(table.storage, table.config, table.write_config)


# -- policies on real copy-on-write tables --------------------------------------------------

def test_clean_keep_latest_commits_cow_deletes_old_versions_and_limits_time_travel(
        tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.cleaner.commits.retained": "2"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 5)
    before = _data_files(table.path)
    run = table.clean()
    assert run.scheduled is not None and run.completed == (run.scheduled,)
    # ECR = instants[3] (5 commits, N=2); kept: slices ≥ ECR and the latest before it.
    gone = {f for f in before if f.split("_")[-1][:17] in instants[:2]}
    assert before - _data_files(table.path) == gone and len(gone) == 4
    assert run.details["files_deleted"] == 4
    _check_snapshot(table, oracle, instants[-1])
    for t in instants[3:]:
        _check_time_travel(table, oracle, t)
    timeline = Timeline.load(table.storage, table.config)
    assert earliest_readable_instant(timeline) == instants[3]
    with pytest.raises(InstantNotReadableError, match=instants[3]) as err:
        table.read(as_of=instants[2])
    assert err.value.earliest == instants[3]
    with pytest.raises(InstantNotReadableError, match=instants[3]):
        table.read_incremental(instants[1])
    assert sorted_rows(table.read_incremental(instants[3]), COLUMNS, key="k") == [
        r for r in oracle.snapshot(instants[-1]) if r["_hoodie_commit_time"] > instants[3]]
    assert table.clean().did_something is False  # nothing left to delete: no instant


def test_clean_keep_latest_file_versions_keeps_v_slices_per_group(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{
        "hoodie.cleaner.policy": "KEEP_LATEST_FILE_VERSIONS",
        "hoodie.cleaner.fileversions.retained": "2"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 4)
    before = _data_files(table.path)
    table.clean()
    kept_instants = {f.split("_")[-1][:17] for f in _data_files(table.path)}
    assert kept_instants == set(instants[2:])
    assert len(before) - len(_data_files(table.path)) == 4
    _check_snapshot(table, oracle, instants[-1])
    _check_time_travel(table, oracle, instants[2])
    timeline = Timeline.load(table.storage, table.config)
    assert earliest_readable_instant(timeline) == instants[2]
    with pytest.raises(InstantNotReadableError, match=instants[2]):
        table.read(as_of=instants[1])


def test_clean_keep_latest_by_hours_uses_commits_newer_than_cutoff(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{
        "hoodie.cleaner.policy": "KEEP_LATEST_BY_HOURS", "hoodie.cleaner.hours.retained": "1"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 4)
    client = _client(table)
    # An hour after instants[3] was requested, it is the first commit inside the window.
    now = parse_instant_time(instants[3]) + _dt.timedelta(hours=1)
    early = run_clean(client, now=parse_instant_time(instants[0]) + _dt.timedelta(minutes=5))
    assert not early.did_something  # every commit is within the last hour
    run = run_clean(client, now=now)
    assert run.completed
    # ECR = instants[3]; the latest slice before it (instants[2]) stays.
    assert {f.split("_")[-1][:17] for f in _data_files(table.path)} == set(instants[2:])
    _check_snapshot(table, oracle, instants[-1])
    _check_time_travel(table, oracle, instants[3])


def test_clean_mor_log_slices_are_never_deleted(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "MERGE_ON_READ", **{"hoodie.cleaner.commits.retained": "1"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 5)
    before = _data_files(table.path)
    assert any(f.startswith(".") for f in before)  # logs on one base slice per group
    assert not table.clean().did_something
    assert _data_files(table.path) == before
    _check_snapshot(table, oracle, instants[-1])


# -- savepoints ------------------------------------------------------------------------------

def test_savepoint_protects_files_and_time_travel_until_deleted(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.cleaner.commits.retained": "1"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 3)
    assert table.savepoint(instants[1], comment="before the backfill") == instants[1]
    with pytest.raises(ValueError, match="savepointed already"):
        table.savepoint(instants[1])
    more = _write_commits(table, oracle, 2)
    table.clean()
    kept = {f.split("_")[-1][:17] for f in _data_files(table.path)}
    assert instants[1] in kept and instants[0] not in kept and instants[2] not in kept
    assert table.savepoints() == [instants[1]]
    _check_snapshot(table, oracle, more[-1])
    _check_time_travel(table, oracle, instants[1])  # the savepoint stays readable
    with pytest.raises(InstantNotReadableError):
        table.read(as_of=instants[2])
    meta = _read_ocf(tmp_path / "t", "clean", "HoodieCleanMetadata")
    assert meta["extraMetadata"]["savepointed_timestamps"] == instants[1]
    sp = _read_ocf(tmp_path / "t", "savepoint", "HoodieSavepointMetadata")
    assert sp["comments"] == "before the backfill" and sp["version"] == 1
    assert {n for p in sp["partitionMetadata"].values() for n in p["savepointDataFile"]} == {
        f for f in _data_files(table.path) if instants[1] in f}
    # The commit the savepoint carries stays a commit on the timeline.
    kinds = {(e.instant_time, e.action) for e in table.timeline()}
    assert (instants[1], "commit") in kinds and (instants[1], "savepoint") in kinds

    table.delete_savepoint(instants[1])
    assert table.savepoints() == []
    table.clean()
    assert instants[1] not in {f.split("_")[-1][:17] for f in _data_files(table.path)}
    with pytest.raises(InstantNotReadableError):
        table.read(as_of=instants[1])
    _check_snapshot(table, oracle, more[-1])
    with pytest.raises(InstantNotReadableError, match="earliest instant still readable"):
        table.savepoint(instants[1])


# -- crash and on-disk records --------------------------------------------------------------

def test_clean_crash_after_inflight_is_finished_by_next_run(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.cleaner.commits.retained": "1"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 4)

    def dying_runner(fn: Any, tasks: Any) -> list[Any]:
        fn(tasks[0])  # one partition cleaned, then the process dies
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_clean(_client(table), runner=dying_runner)
    timeline = Timeline.load(table.storage, table.config)
    [pending] = timeline.pending([Action.CLEAN])
    assert pending.state is State.INFLIGHT
    _check_snapshot(table, oracle, instants[-1])  # a half-done clean hurts no snapshot
    run = table.clean()
    assert run.completed == (pending.requested_time,) and run.scheduled is None
    assert {f.split("_")[-1][:17] for f in _data_files(table.path)} == set(instants[2:])
    meta = _read_ocf(tmp_path / "t", "clean", "HoodieCleanMetadata")
    assert meta["totalFilesDeleted"] == 4  # a file already gone counts as deleted
    _check_snapshot(table, oracle, instants[-1])


def test_clean_schedule_only_writes_plan_that_decodes_with_avsc(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.cleaner.commits.retained": "2"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 4)
    before = _data_files(table.path)
    run = table.clean(schedule_only=True)
    assert run.scheduled and not run.completed and _data_files(table.path) == before
    plan = _read_ocf(tmp_path / "t", "clean.requested", "HoodieCleanerPlan")
    assert plan["version"] == 2 and plan["policy"] == "KEEP_LATEST_COMMITS"
    assert plan["earliestInstantToRetain"] == {
        "timestamp": instants[2], "action": "commit", "state": "COMPLETED"}
    assert plan["lastCompletedCommitTimestamp"] == instants[3]
    paths = [i["filePath"] for infos in plan["filePathsToBeDeletedPerPartition"].values()
             for i in infos]
    base = str(table.storage.base_path)
    assert len(paths) == 2 and all(p.startswith(f"file:{base}/") for p in paths)
    assert {p.rsplit("_", 1)[-1][:17] for p in paths} == {instants[0]}
    assert plan["partitionsToBeDeleted"] == []
    assert plan["extraMetadata"]["savepointed_timestamps"] == ""
    run = table.clean()
    assert run.completed and run.scheduled is None
    meta = _read_ocf(tmp_path / "t", "clean", "HoodieCleanMetadata")
    assert meta["earliestCommitToRetain"] == instants[2] and meta["version"] == 2
    assert meta["startCleanTime"] == run.completed[0]
    assert sorted(n for p in meta["partitionMetadata"].values()
                  for n in p["successDeleteFiles"]) == sorted(p.rsplit("/", 1)[-1]
                                                              for p in paths)
    _check_snapshot(table, oracle, instants[-1])


def _read_ocf(path: Path, suffix: str, schema: str) -> dict[str, Any]:
    """The newest timeline file ending in ``.<suffix>``, read with our .avsc as the reader
    schema (as Java reads it with its class schema)."""
    folder = path / ".hoodie" / "timeline"
    names = sorted(n for n in os.listdir(folder) if n.endswith("." + suffix))
    with open(folder / names[-1], "rb") as fh:
        records = list(fastavro.reader(io.BytesIO(fh.read()), reader_schema=avro_schema(schema)))
    assert len(records) == 1 and isinstance(records[0], dict)
    return records[0]


# -- pending clustering ----------------------------------------------------------------------

_REPLACE_SCHEMA = {
    "type": "record", "name": "org.apache.hudi.avro.model.HoodieRequestedReplaceMetadata",
    "fields": [
        {"name": "operationType", "type": ["null", "string"], "default": None},
        {"name": "clusteringPlan", "type": ["null", {
            "type": "record", "name": "org.apache.hudi.avro.model.HoodieClusteringPlan",
            "fields": [{"name": "inputGroups", "type": {"type": "array", "items": {
                "type": "record", "name": "org.apache.hudi.avro.model.HoodieClusteringGroup",
                "fields": [{"name": "slices", "type": {"type": "array", "items": {
                    "type": "record", "name": "org.apache.hudi.avro.model.HoodieSliceInfo",
                    "fields": [
                        {"name": "dataFilePath", "type": ["null", "string"], "default": None},
                        {"name": "deltaFilePaths", "type": ["null", {
                            "type": "array", "items": "string"}], "default": None},
                        {"name": "fileId", "type": ["null", "string"]},
                        {"name": "partitionPath", "type": ["null", "string"], "default": None},
                    ]}}}]}}}]}], "default": None},
        {"name": "extraMetadata", "type": ["null", {"type": "map", "values": "string"}],
         "default": None},
        {"name": "version", "type": ["int", "null"], "default": 1},
    ]}


def _write_clustering_plan(table: Table, instant: str, base_files: list[str]) -> None:
    slices = [{"dataFilePath": f"file:{table.storage.full(rel)}", "deltaFilePaths": [],
               "fileId": rel.rsplit("/", 1)[-1].split("_")[0], "partitionPath": rel.split("/")[0]}
              for rel in base_files]
    record = {"operationType": "CLUSTER", "clusteringPlan": {"inputGroups": [{"slices": slices}]},
              "extraMetadata": {}, "version": 1}
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(_REPLACE_SCHEMA), [record], codec="null")
    table.storage.write_new(f".hoodie/timeline/{instant}.clustering.requested", buf.getvalue())


def test_clean_pending_clustering_inputs_are_kept_and_bound_ecr(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{
        "hoodie.cleaner.policy": "KEEP_LATEST_FILE_VERSIONS",
        "hoodie.cleaner.fileversions.retained": "1"})
    oracle = Oracle(key="k")
    first = _write_commits(table, oracle, 1)
    inputs = sorted(f"{p}/{f}" for p in ("p0", "p1") for f in os.listdir(table.path + "/" + p)
                    if f.endswith(".parquet"))
    # The plan was made at `first`; the writes below (by a writer that ignores it) add
    # newer slices, so the plan's inputs are no longer the latest slices.
    timeline = Timeline.load(table.storage, table.config)
    clustering = timeline.create_requested(Action.CLUSTERING).requested_time
    table.storage.delete(f".hoodie/timeline/{clustering}.clustering.requested")
    _write_clustering_plan(table, clustering, inputs)
    instants = first + _write_commits(table, oracle, 3)
    table.clean()
    kept = _data_files(table.path)
    assert {i.rsplit("/", 1)[-1] for i in inputs} <= kept
    assert {f.split("_")[-1][:17] for f in kept} == {first[0], instants[-1]}
    _check_snapshot(table, oracle, instants[-1])

    # Under KEEP_LATEST_COMMITS the pending clustering bounds the ECR: nothing older goes.
    commits = Table.open(table.path, {"hoodie.cleaner.commits.retained": "1"})
    timeline = Timeline.load(table.storage, table.config)
    assert plan_clean(table.storage, timeline, commits.write_config) is None


# -- the §5.2 worked example (MOR, N = 3), from named files ---------------------------------

def _t(i: int, ms: int = 0) -> str:
    return f"2026010100{i:02d}00{ms:03d}"


class FakeTable:
    """A MOR table whose data files are empty files with Hudi names."""

    def __init__(self, path: Path) -> None:
        self.table = _create(path, "MERGE_ON_READ")
        self.storage = self.table.storage
        self.fid = "11111111-2222-3333-4444-555555555555-0"

    def instant(self, action: Action, requested: str, completed: str | None) -> None:
        folder = ".hoodie/timeline"
        for state in (State.REQUESTED, State.INFLIGHT):
            self.storage.write_new(f"{folder}/{Instant(requested, action, state).file_name()}",
                                   b"")
        if completed is not None:
            done = Instant(requested, action, State.COMPLETED, completed)
            self.storage.write_new(f"{folder}/{done.file_name()}",
                                   CommitMetadata().to_avro_bytes())

    def base(self, t: str) -> str:
        rel = f"p0/{self.fid}_0-0-0_{t}.parquet"
        self.storage.write_new(rel, b"")
        return rel

    def log(self, t: str) -> str:
        rel = f"p0/.{self.fid}_{t}.log.1_0-0-0"
        self.storage.write_new(rel, b"")
        return rel

    def compaction_plan(self, t: str, base_instant: str) -> None:
        schema = {"type": "record", "name": "org.apache.hudi.avro.model.HoodieCompactionPlan",
                  "fields": [{"name": "operations", "type": {"type": "array", "items": {
                      "type": "record",
                      "name": "org.apache.hudi.avro.model.HoodieCompactionOperation",
                      "fields": [{"name": "baseInstantTime", "type": "string"},
                                 {"name": "fileId", "type": "string"},
                                 {"name": "partitionPath", "type": "string"}]}}},
                             {"name": "version", "type": "int"}]}
        buf = io.BytesIO()
        fastavro.writer(buf, fastavro.parse_schema(schema), [{"operations": [{
            "baseInstantTime": base_instant, "fileId": self.fid, "partitionPath": "p0"}],
            "version": 2}], codec="null")
        self.storage.write_new(f".hoodie/timeline/{t}.compaction.requested", buf.getvalue())

    def plan(self, **options: str) -> set[str]:
        timeline = Timeline.load(self.storage, self.table.config)
        plan = plan_clean(self.storage, timeline, WriteConfig.from_options(options))
        return set() if plan is None else {p for ps in plan.files.values() for p in ps}


def _worked_example(path: Path) -> tuple[FakeTable, dict[str, str]]:
    fake = FakeTable(path)
    files: dict[str, str] = {}
    for i in range(1, 9):
        compaction = i in (4, 7)
        fake.instant(Action.COMPACTION if compaction else Action.DELTA_COMMIT, _t(i),
                     _t(i, 500))
        files[f"t{i}"] = fake.base(_t(i)) if i in (1, 4, 7) else fake.log(_t(i))
    return fake, files


def test_clean_worked_example_commits_and_versions(tmp_path: Path) -> None:
    fake, files = _worked_example(tmp_path / "t")
    doomed = {files["t1"], files["t2"], files["t3"]}
    assert fake.plan(**{"hoodie.cleaner.commits.retained": "3"}) == doomed
    assert fake.plan(**{"hoodie.cleaner.policy": "KEEP_LATEST_FILE_VERSIONS",
                        "hoodie.cleaner.fileversions.retained": "2"}) == doomed
    assert fake.plan(**{"hoodie.cleaner.commits.retained": "8"}) == set()  # not due yet


def test_clean_worked_example_pending_compaction_protects_its_slice(tmp_path: Path) -> None:
    fake, files = _worked_example(tmp_path / "t")
    fake.compaction_plan(_t(9), _t(7))
    # A log requested before the compaction but completed after it belongs to slice t9.
    fake.instant(Action.DELTA_COMMIT, _t(8, 700), _t(10))
    late = fake.log(_t(8, 700))
    versions = {"hoodie.cleaner.policy": "KEEP_LATEST_FILE_VERSIONS",
                "hoodie.cleaner.fileversions.retained": "2"}
    assert fake.plan(**versions) == {files["t1"], files["t2"], files["t3"]}
    timeline = Timeline.load(fake.storage, fake.table.config)
    slices = build_file_slices(list_table_files(fake.storage), timeline,
                               visible_instants(timeline), latest_only=False,
                               pending_slice_starts={("p0", fake.fid): _t(9)})
    assert [(s.base_instant, [log.path for log in s.log_files]) for s in slices] == [
        (_t(1), [files["t2"], files["t3"]]), (_t(4), [files["t5"], files["t6"]]),
        (_t(7), [files["t8"]]), (_t(9), [late])]
    assert late not in fake.plan(**{**versions, "hoodie.cleaner.fileversions.retained": "1"})
    # The pending compaction (t9) is after the would-be ECR: ECR stays t7 with N = 3.
    assert fake.plan(**{"hoodie.cleaner.commits.retained": "3"}) == {
        files["t1"], files["t2"], files["t3"]}


def test_clean_worked_example_late_log_stays_with_its_slice(tmp_path: Path) -> None:
    fake, files = _worked_example(tmp_path / "t")
    # Requested before compaction t4, completed after it: slice t4 by completion time. A
    # cleaner that sliced by requested time would delete it with slice t1.
    fake.instant(Action.DELTA_COMMIT, _t(3, 700), _t(5, 100))
    late = fake.log(_t(3, 700))
    fake.instant(Action.DELTA_COMMIT, _t(11), _t(11, 500))
    fake.instant(Action.COMPACTION, _t(12), _t(12, 500))
    fake.base(_t(12))
    # 11 commits, N = 3 → ECR = t8 (index 8): kept t12 (latest), t7 (latest before ECR).
    doomed = fake.plan(**{"hoodie.cleaner.commits.retained": "3"})
    assert late in doomed and files["t4"] in doomed and files["t5"] in doomed
    assert files["t7"] not in doomed and files["t8"] not in doomed
    doomed_v = fake.plan(**{"hoodie.cleaner.policy": "KEEP_LATEST_FILE_VERSIONS",
                            "hoodie.cleaner.fileversions.retained": "3"})
    assert doomed_v == {files["t1"], files["t2"], files["t3"]} and late not in doomed_v


def test_clean_pending_write_older_than_candidate_bounds_ecr(tmp_path: Path) -> None:
    fake, _files = _worked_example(tmp_path / "t")
    fake.instant(Action.DELTA_COMMIT, _t(4, 900), None)  # a write still in flight
    # ECR would be t6; the pending write at t4.9 lowers it to t4: slice t1 is the latest
    # before t4 and stays, so nothing is deleted.
    assert fake.plan(**{"hoodie.cleaner.commits.retained": "3"}) == set()


def test_check_readable_savepoint_window(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.cleaner.commits.retained": "1"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 3)
    table.savepoint(instants[0])
    instants += _write_commits(table, oracle, 2)
    table.clean()
    timeline = Timeline.load(table.storage, table.config)
    check_readable(timeline, as_of=instants[0])
    with pytest.raises(InstantNotReadableError):
        check_readable(timeline, as_of=instants[1])
    with pytest.raises(InstantNotReadableError):
        check_readable(timeline, start=instants[0])  # a savepoint keeps no range readable
    check_readable(timeline, as_of=instants[-1])


def test_clean_plan_round_trips(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE")
    plan = CleanerPlan("KEEP_LATEST_COMMITS", Instant(_t(1), Action.COMMIT, State.COMPLETED),
                       _t(2), {"p0": ("p0/a_0-0-0_20260101000100000.parquet",)}, (_t(1),), _t(1))
    back = CleanerPlan.from_bytes(plan.to_avro_bytes(table.storage), table.storage, "x")
    assert back == plan


@pytest.mark.slow
def test_clean_thousand_files(tmp_path: Path) -> None:
    fake = FakeTable(tmp_path / "t")
    for i in range(1, 11):
        fake.instant(Action.COMMIT, _t(i), _t(i, 500))
    fids = [f"{n:08d}-2222-3333-4444-555555555555-0" for n in range(100)]
    for i in range(1, 11):
        for fid in fids:
            fake.storage.write_new(f"p0/{fid}_0-0-0_{_t(i)}.parquet", b"", fsync=False)
    table = Table.open(fake.table.path, {"hoodie.cleaner.commits.retained": "1"})
    run = run_clean(_client(table), runner=local_runner)
    assert run.details["files_deleted"] == 800  # ECR t10: keep t10 and t9 of each group
    assert len(_data_files(Path(table.path))) == 200


def test_clean_finished_by_two_processes_completes_once(tmp_path: Path) -> None:
    table = _create(tmp_path / "t", "COPY_ON_WRITE", **{"hoodie.cleaner.commits.retained": "1"})
    oracle = Oracle(key="k")
    instants = _write_commits(table, oracle, 3)
    scheduled = table.clean(schedule_only=True).scheduled
    assert scheduled is not None

    def racing_runner(fn: Any, tasks: Any) -> list[Any]:
        other = table.clean()  # another process finishes the same plan meanwhile
        assert other.completed == (scheduled,)
        return local_runner(fn, tasks)

    run = run_clean(_client(table), runner=racing_runner)
    assert run.completed == () and run.scheduled is None
    names = os.listdir(Path(table.path) / ".hoodie" / "timeline")
    assert len([n for n in names if n.startswith(scheduled) and n.endswith(".clean")]) == 1
    _check_snapshot(table, oracle, instants[-1])
