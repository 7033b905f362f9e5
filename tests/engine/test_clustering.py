"""Clustering: plans, execution, crash recovery and writers running beside it.

Every snapshot is judged against an oracle (a dict of key → row and commit time, built
from what each write was told) and against hudi-rs 0.5.0.
"""

from __future__ import annotations

import io
import pickle
import random
import shutil
import threading
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Table, WriteConflictError
from engine.errors import InvalidOptionError
from engine.layout.file_group import list_table_files
from engine.services.base import local_runner
from engine.services.clustering import clustering_due, read_plan
from engine.services.curves import sort_indices
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import avro_schema
from engine.timeline.heartbeat import Heartbeat
from engine.write.write_client import UPSERT, WriteClient
from tests.helpers import COMMIT_TIME, Oracle, hudi_rs_read, sorted_rows
from tests.soak import soak

SCHEMA = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("part", pa.string()),
                    ("x", pa.int32()), ("y", pa.int64()), ("note", pa.string())])
COLUMNS = ["key", "ts", "part", "x", "y", "note", COMMIT_TIME]
PARTS = ["a", "b/c"]


def _check(table: Table, oracle: Oracle) -> None:
    expected = oracle.snapshot()
    assert sorted_rows(table.read(), COLUMNS) == expected
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == expected


def _random_rows(rng: random.Random, keys: list[str], ts: int, parts: list[str],
                 oracle: Oracle) -> list[dict[str, Any]]:
    rows = []
    for key in keys:
        part = oracle.rows[key]["part"] if key in oracle.rows else rng.choice(parts)
        rows.append({"key": key, "ts": ts, "part": part, "x": rng.randint(-50, 50),
                     "y": rng.randint(0, 10**12) if rng.random() > 0.1 else None,
                     "note": rng.choice(["", "x", "ünï", None, "long note text"])})
    return rows


def _make(path: Path, table_type: str, *, partitioned: bool = True, strategy: str = "linear",
          seed: int = 0, **options: str) -> tuple[Table, Oracle, random.Random]:
    """A table with several small file groups per partition, updates and deletes on top."""
    rng = random.Random(seed)
    parts = PARTS if partitioned else [""]
    opts = {"hoodie.clustering.plan.strategy.sort.columns": "y,x",
            "hoodie.layout.optimize.strategy": strategy, **options}
    table = Table.create(str(path), name="cl", table_type=table_type, record_key="key",
                         precombine="ts", partition_by=["part"] if partitioned else None,
                         options=opts)
    oracle = Oracle()
    n = 0
    for _ in range(3):
        keys = [f"k{n + i:04d}" for i in range(40)]
        n += 40
        rows = _random_rows(rng, keys, 1, parts if partitioned else ["x"], oracle)
        instant = table.bulk_insert(pa.Table.from_pylist(rows, schema=SCHEMA))
        oracle.upsert(rows, instant)
    rows = _random_rows(rng, rng.sample(sorted(oracle.rows), 25), 2, parts, oracle)
    instant = table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
    oracle.upsert(rows, instant)
    victims = rng.sample(sorted(oracle.rows), 6)
    table.delete(pa.table({"key": victims, "part": [oracle.rows[k]["part"] for k in victims]}))
    oracle.delete(victims)
    return table, oracle, rng


def _replacecommits(table: Table) -> list[Any]:
    return [e for e in table.timeline() if e.action == "replacecommit"
            and e.state == "completed"]


def _decode(data: bytes, schema_name: str) -> dict[str, Any]:
    records = list(fastavro.reader(io.BytesIO(data), reader_schema=avro_schema(schema_name)))
    assert len(records) == 1
    record = records[0]
    assert isinstance(record, dict)
    return record


CASES = [(t, p, s) for t in ("COPY_ON_WRITE", "MERGE_ON_READ") for p in (True, False)
         for s in ("linear", "z-order", "hilbert")]


@pytest.mark.parametrize(("table_type", "partitioned", "strategy"), CASES,
                         ids=[f"{t[:3]}-{'part' if p else 'flat'}-{s}" for t, p, s in CASES])
def test_cluster_snapshot_matches_oracle_and_hudi_rs(tmp_path: Path, table_type: str,
                                                     partitioned: bool, strategy: str) -> None:
    table, oracle, _ = _make(tmp_path / "t", table_type, partitioned=partitioned,
                             strategy=strategy)
    before_groups = {(s.partition_path, s.file_id) for s in table.file_slices()}
    last_commit = table.timeline()[-1].instant_time
    old_snapshot = oracle.snapshot()

    run = table.cluster()

    assert run.scheduled is not None and run.completed == (run.scheduled,)
    assert run.details["rows"] == len(oracle.rows)
    _check(table, oracle)  # commit times preserved: the oracle's are the writers'
    slices = table.file_slices()
    assert {s.base_instant for s in slices} == {run.scheduled}
    assert not {(s.partition_path, s.file_id) for s in slices} & before_groups
    assert len(slices) == (2 if partitioned else 1)
    # each new file is in the strategy's order over (y, x)
    storage = Storage(table.path)
    for slc in slices:
        assert slc.base_file is not None and not slc.log_files
        data = pq.read_table(storage.full(slc.base_file.path))
        assert set(data.column("_hoodie_file_name").to_pylist()) == {slc.base_file.name}
        assert sort_indices(data, ["y", "x"], strategy).tolist() == list(range(data.num_rows))
    # the replacecommit
    done = _replacecommits(table)[-1]
    rel = f".hoodie/timeline/{done.instant_time}_{done.completion_time}.replacecommit"
    meta = _decode(storage.read(rel), "HoodieReplaceCommitMetadata")
    assert meta["operationType"] == "CLUSTER"
    replaced = {(p, f) for p, ids in meta["partitionToReplaceFileIds"].items() for f in ids}
    assert replaced == before_groups
    stats = [s for ss in meta["partitionToWriteStats"].values() for s in ss]
    assert {s["prevCommit"] for s in stats} == {"null"}
    assert sum(s["numInserts"] for s in stats) == len(oracle.rows)
    assert meta["extraMetadata"]["schema"]
    # an incremental read starting after the clustering returns nothing
    assert table.read_incremental(done.completion_time).num_rows == 0
    assert hudi_rs_read(table.path, start=done.completion_time).num_rows == 0
    # time travel before the clustering shows the old file groups
    old = table.read(as_of=last_commit)
    assert sorted_rows(old, COLUMNS) == old_snapshot
    assert sorted_rows(hudi_rs_read(table.path, as_of=last_commit), COLUMNS) == old_snapshot
    assert run.scheduled not in "".join(old.column("_hoodie_file_name").to_pylist())
    assert clustering_due(Timeline.load(table.storage, table.config), table.write_config,
                          inline=True) is False
    # an incremental read spanning the clustering returns only what writers wrote
    before = next(e.completion_time for e in table.timeline() if e.instant_time == last_commit)
    rows = _random_rows(random.Random(1), sorted(oracle.rows)[:3], 7, PARTS, oracle)
    instant = table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
    oracle.upsert(rows, instant)
    expected = [oracle.row(k) for k in sorted(r["key"] for r in rows)]
    assert sorted_rows(table.read_incremental(before), COLUMNS) == expected
    assert sorted_rows(hudi_rs_read(table.path, start=before), COLUMNS) == expected
    _check(table, oracle)


def test_plan_decodes_with_full_paths_and_sort_columns(tmp_path: Path) -> None:
    table, _, _ = _make(tmp_path / "t", "MERGE_ON_READ", strategy="z-order")
    slices = {(s.partition_path, s.file_id): s for s in table.file_slices()}
    run = table.cluster(schedule_only=True)
    assert run.scheduled is not None and not run.completed
    storage = Storage(table.path)
    plan = _decode(storage.read(f".hoodie/timeline/{run.scheduled}.clustering.requested"),
                   "HoodieRequestedReplaceMetadata")
    assert plan["operationType"] == "CLUSTER"
    cplan = plan["clusteringPlan"]
    assert cplan["strategy"]["strategyClassName"] == (
        "org.apache.hudi.client.clustering.run.strategy.SparkSortAndSizeExecutionStrategy")
    assert cplan["strategy"]["strategyParams"] == {
        "hoodie.clustering.plan.strategy.sort.columns": "y,x"}
    assert cplan["preserveHoodieMetadata"] is True
    seen = set()
    for group in cplan["inputGroups"]:
        assert group["numOutputFileGroups"] == 1
        assert set(group["metrics"]) == {"TOTAL_LOG_FILES", "TOTAL_LOG_FILES_SIZE",
                                         "TOTAL_IO_READ_MB", "TOTAL_IO_WRITE_MB",
                                         "TOTAL_IO_MB"}
        assert len({s["partitionPath"] for s in group["slices"]}) == 1
        for info in group["slices"]:
            slc = slices[(info["partitionPath"], info["fileId"])]
            seen.add((info["partitionPath"], info["fileId"]))
            assert slc.base_file is not None
            assert info["dataFilePath"] == storage.full(slc.base_file.path)
            assert info["deltaFilePaths"] == [storage.full(log.path) for log in slc.log_files]
            assert Path(info["dataFilePath"]).is_absolute()
            assert info["bootstrapFilePath"] == ""
    assert seen == set(slices)
    # pending: readers still see the old groups; a second schedule finds nothing left
    assert not table.cluster(schedule_only=True).did_something
    assert {(s.partition_path, s.file_id) for s in table.file_slices()} == set(slices)


def test_partition_filters_and_group_limits(tmp_path: Path) -> None:
    table, oracle, _ = _make(tmp_path / "t", "COPY_ON_WRITE",
                             **{"hoodie.clustering.plan.strategy.partition.regex.pattern": "b.*",
                                "hoodie.clustering.plan.strategy.max.bytes.per.group": "1",
                                "hoodie.clustering.plan.strategy.max.num.groups": "2"})
    run = table.cluster(schedule_only=True)
    assert run.scheduled is not None
    plan = read_plan(Timeline.load(table.storage, table.config), run.scheduled)
    groups = plan["clusteringPlan"]["inputGroups"]  # type: ignore[index]
    assert len(groups) == 2  # one slice per group (1 byte per group), at most two groups
    assert {s["partitionPath"] for g in groups for s in g["slices"]} == {"b%2Fc"}  # url-encoded
    assert all(len(g["slices"]) == 1 for g in groups)
    table.cluster()
    _check(table, oracle)


def test_groups_cut_by_size_as_java_and_outputs_by_target(tmp_path: Path) -> None:
    table, oracle, _ = _make(tmp_path / "t", "COPY_ON_WRITE")
    slices = sorted((s for s in table.file_slices() if s.partition_path == "a"),
                    key=lambda s: -(s.base_file.size if s.base_file else 0))
    sizes = [s.base_file.size for s in slices if s.base_file is not None]
    assert len(sizes) >= 3
    opened = Table.open(table.path, {
        "hoodie.clustering.plan.strategy.partition.selected": "a",
        # the two biggest together pass the limit by one byte: the second starts a group
        "hoodie.clustering.plan.strategy.max.bytes.per.group": str(sizes[0] + sizes[1] - 1),
        "hoodie.clustering.plan.strategy.target.file.max.bytes": str(sizes[0] // 2 + 1)})
    run = opened.cluster(schedule_only=True)
    assert run.scheduled is not None
    plan = read_plan(Timeline.load(table.storage, table.config), run.scheduled)
    groups = plan["clusteringPlan"]["inputGroups"]  # type: ignore[index]
    assert [s["fileId"] for s in groups[0]["slices"]] == [slices[0].file_id]
    assert groups[1]["slices"][0]["fileId"] == slices[1].file_id
    assert groups[0]["numOutputFileGroups"] == 2
    assert {s["partitionPath"] for g in groups for s in g["slices"]} == {"a"}
    done = opened.cluster()
    assert done.completed == (run.scheduled,)
    _check(table, oracle)
    new = [s for s in table.file_slices() if s.base_instant == run.scheduled]
    assert len(new) == sum(g["numOutputFileGroups"] for g in groups)


def test_trailing_single_slice_group_dropped_without_single_group_or_sort(
        tmp_path: Path) -> None:
    table, oracle, _ = _make(tmp_path / "t", "MERGE_ON_READ", **{
        "hoodie.clustering.plan.strategy.sort.columns": "",
        "hoodie.clustering.plan.strategy.single.group.clustering.enabled": "false",
        "hoodie.clustering.plan.strategy.max.bytes.per.group": "1"})
    per_partition: dict[str, int] = {}
    for slc in table.file_slices():
        per_partition[slc.partition_path] = per_partition.get(slc.partition_path, 0) + 1
    run = table.cluster(schedule_only=True)
    assert run.scheduled is not None
    plan = read_plan(Timeline.load(table.storage, table.config), run.scheduled)
    counts: dict[str, int] = {}
    for group in plan["clusteringPlan"]["inputGroups"]:  # type: ignore[index]
        assert len(group["slices"]) == 1
        part = group["slices"][0]["partitionPath"]
        counts[part] = counts.get(part, 0) + 1
    # one group per slice (1 byte per group), but the last one-slice group of a partition
    # is dropped (Java's rule when neither single-group clustering nor sort columns apply)
    assert counts == {p: n - 1 for p, n in per_partition.items() if n > 1}
    assert "hoodie.clustering.plan.strategy.sort.columns" not in (
        plan["clusteringPlan"]["strategy"]["strategyParams"])  # type: ignore[index]
    table.cluster()
    _check(table, oracle)


def test_unknown_sort_column_is_refused_before_planning(tmp_path: Path) -> None:
    table, oracle, _ = _make(tmp_path / "t", "COPY_ON_WRITE")
    opened = Table.open(table.path, {"hoodie.clustering.plan.strategy.sort.columns": "x,nope"})
    with pytest.raises(InvalidOptionError, match=r"sort\.columns.*nope"):
        opened.cluster()
    assert not [e for e in table.timeline() if e.action == "clustering"]
    _check(table, oracle)


def test_bucket_index_table_is_never_clustered(tmp_path: Path) -> None:
    table, oracle, _ = _make(tmp_path / "t", "MERGE_ON_READ",
                             **{"hoodie.index.type": "BUCKET",
                                "hoodie.bucket.index.num.buckets": "2"})
    run = table.cluster()
    assert not run.did_something
    assert not [e for e in table.timeline() if e.action in ("clustering", "replacecommit")]
    _check(table, oracle)


def test_clustering_due_counts_commits_since_last_clustering(tmp_path: Path) -> None:
    table, _, rng = _make(tmp_path / "t", "MERGE_ON_READ",
                          **{"hoodie.clustering.inline.max.commits": "3",
                             "hoodie.clustering.async.max.commits": "1"})

    def due(inline: bool) -> bool:
        return clustering_due(Timeline.load(table.storage, table.config), table.write_config,
                              inline=inline)

    assert due(True) and due(False)
    table.cluster()
    assert not due(True) and not due(False)
    for i in range(2):
        table.upsert(pa.Table.from_pylist(_random_rows(rng, [f"n{i}"], 5, PARTS, Oracle()),
                                          schema=SCHEMA))
    assert due(False) and not due(True)
    table.upsert(pa.Table.from_pylist(_random_rows(rng, ["n9"], 5, PARTS, Oracle()),
                                      schema=SCHEMA))
    assert due(True)
    table.cluster(schedule_only=True)
    assert not due(False)  # a pending plan counts as the latest clustering


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_crashed_attempt_is_reverted_and_executed_again(tmp_path: Path,
                                                        table_type: str) -> None:
    table, oracle, _ = _make(tmp_path / "t", table_type)
    scheduled = table.cluster(schedule_only=True).scheduled
    assert scheduled is not None
    # a crashed attempt: inflight, a partial output file and a temporary file, no heartbeat
    storage = Storage(table.path)
    timeline = Timeline.load(storage, table.config)
    requested = next(i for i in timeline.instants if i.requested_time == scheduled)
    timeline.transition_to_inflight(requested)
    some = table.file_slices()[0]
    assert some.base_file is not None
    dead = "0badc0de-0000-0000-0000-00000000000"
    partial = f"{some.partition_path}/{dead}0-0_0-0-0_{scheduled}.parquet"
    shutil.copy(storage.full(some.base_file.path), storage.full(partial))
    temp = f"{some.partition_path}/.tmp.ab.{dead}1-0_0-0-0_{scheduled}.parquet"
    Path(storage.full(temp)).write_bytes(b"partial")
    _check(table, oracle)  # the attempt is invisible

    # a live attempt (fresh heartbeat) is left alone
    Heartbeat(storage, scheduled, 60).beat()
    assert not table.cluster(instant=scheduled).did_something
    assert storage.exists(partial)
    storage.delete(f".hoodie/.heartbeat/{scheduled}")

    run = table.cluster(instant=scheduled)
    assert run.completed == (scheduled,)
    assert not storage.exists(partial) and not storage.exists(temp)
    rollbacks = [e for e in table.timeline() if e.action == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0].state == "completed"
    _check(table, oracle)
    files = list_table_files(storage)
    outputs = {f.path for f in files.base_files if f.instant_time == scheduled}
    assert outputs == {s.base_file.path for s in table.file_slices() if s.base_file}


def test_failed_execution_reverts_and_keeps_plan(tmp_path: Path) -> None:
    table, oracle, _ = _make(tmp_path / "t", "MERGE_ON_READ")
    scheduled = table.cluster(schedule_only=True).scheduled

    def failing(fn: Any, tasks: Any) -> list[Any]:
        local_runner(fn, tasks[:1])  # some files written, then the job dies
        raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError, match="executor lost"):
        table.cluster(instant=scheduled, runner=failing)
    entry = next(e for e in table.timeline() if e.instant_time == scheduled)
    assert (entry.action, entry.state) == ("clustering", "requested")
    assert not [f for f in list_table_files(Storage(table.path)).base_files
                if f.instant_time == scheduled]
    _check(table, oracle)
    assert table.cluster().completed == (scheduled,)
    _check(table, oracle)


def test_tasks_run_pickled_as_on_spark_executors(tmp_path: Path) -> None:
    table, oracle, _ = _make(tmp_path / "t", "MERGE_ON_READ", strategy="hilbert",
                             **{"hoodie.clustering.plan.strategy.max.bytes.per.group": "1"})
    seen: list[int] = []

    def spark_like(fn: Any, tasks: Any) -> list[Any]:
        seen.append(len(tasks))
        shipped = [pickle.loads(pickle.dumps(task)) for task in tasks]
        return [pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(fn))(task)))
                for task in shipped]

    run = table.cluster(runner=spark_like)
    assert run.completed and seen and seen[0] > 2  # one task per clustering group
    _check(table, oracle)


def test_inserts_avoid_groups_under_pending_clustering(tmp_path: Path) -> None:
    table, oracle, rng = _make(tmp_path / "t", "COPY_ON_WRITE")
    scheduled = table.cluster(schedule_only=True).scheduled
    assert scheduled is not None
    planned = {(s.partition_path, s.file_id) for s in table.file_slices()}
    rows = _random_rows(rng, [f"new{i}" for i in range(10)], 1, PARTS, oracle)
    instant = table.insert(pa.Table.from_pylist(rows, schema=SCHEMA))
    oracle.upsert(rows, instant)
    written = {(s.partition_path, s.file_id) for s in table.file_slices()
               if s.base_instant == instant}
    assert written and not written & planned
    table.cluster(instant=scheduled)
    _check(table, oracle)
    # the insert's groups were not in the plan: they survive beside the clustered ones
    assert written <= {(s.partition_path, s.file_id) for s in table.file_slices()}


@pytest.mark.parametrize("mode", ["OPTIMISTIC_CONCURRENCY_CONTROL", "SINGLE_WRITER"])
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_write_inflight_when_clustering_commits_is_refused_then_retried(
        tmp_path: Path, table_type: str, mode: str) -> None:
    # a single writer too: its own async clustering runs beside its writes
    table, oracle, rng = _make(tmp_path / "t", table_type,
                               **{"hoodie.write.concurrency.mode": mode})
    keys = sorted(oracle.rows)[:5]
    rows = _random_rows(rng, keys, 9, PARTS, oracle)
    data = pa.Table.from_pylist(rows, schema=SCHEMA)
    client = WriteClient(table.storage, table.config, table.write_config)
    timeline, inflight = client.begin()
    records, deletes = client.prepare(data, timeline, dedupe=True)
    plan = client.plan(timeline, inflight, UPSERT, records, deletes)
    stats = client.execute_local(plan)

    run = table.cluster()  # the plan is made while the write is inflight: no conflict yet
    assert run.completed
    with pytest.raises(WriteConflictError, match="replacecommit"):
        client.commit(timeline, plan, stats)
    assert not [e for e in table.timeline() if e.instant_time == inflight.requested_time]
    _check(table, oracle)  # nothing of the refused write is visible
    instant = table.upsert(data)  # the retry lands in the new file groups
    oracle.upsert(rows, instant)
    _check(table, oracle)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_writers_during_clustering_lose_nothing(tmp_path: Path, table_type: str,
                                                seed: int) -> None:
    _writers_during_clustering(tmp_path, table_type, seed)


@pytest.mark.slow
# Seeds beyond the quick suite's 0-2: soak size only (docs/testing.md).
@pytest.mark.parametrize("seed", soak(range(3, 3), range(3, 15)))
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_writers_during_clustering_many_seeds_lose_nothing(tmp_path: Path, table_type: str,
                                                           seed: int) -> None:
    _writers_during_clustering(tmp_path, table_type, seed)


def _writers_during_clustering(tmp_path: Path, table_type: str, seed: int) -> None:
    """Two writer threads upsert, delete and insert keys of the clustered groups (each its
    own keys, retrying refused batches) while a clustering executes and commits; the
    clustering's runner waits for a few writer commits between reading and committing, so
    the carry-over is always exercised."""
    table, oracle, _ = _make(tmp_path / "t", table_type, seed=seed, strategy="z-order")
    owners: list[list[str]] = [[], []]
    for i, key in enumerate(sorted(oracle.rows)):
        owners[i % 2].append(key)
    lock = threading.Lock()
    committed = [0]
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(me: int) -> None:
        wrng = random.Random(seed * 10 + me)
        mine = owners[me]
        ts = 10
        fresh = 0
        try:
            while not stop.is_set():
                ts += 1
                opened = Table.open(table.path)
                with lock:
                    live = [k for k in mine if k in oracle.rows]
                if live and wrng.random() < 0.25:
                    victims = wrng.sample(live, min(3, len(live)))
                    with lock:
                        parts = [oracle.rows[k]["part"] for k in victims]
                    data = pa.table({"key": victims, "part": parts})
                    op = "delete"
                else:
                    keys = wrng.sample(live, min(6, len(live)))
                    if wrng.random() < 0.3:
                        fresh += 1
                        keys.append(f"w{me}-{fresh:03d}")
                        mine.append(keys[-1])
                    with lock:
                        rows = _random_rows(wrng, keys, ts, PARTS, oracle)
                    data = pa.Table.from_pylist(rows, schema=SCHEMA)
                    op = "upsert"
                for _attempt in range(100):
                    try:
                        instant = (opened.delete(data) if op == "delete"
                                   else opened.upsert(data))
                        break
                    except WriteConflictError:
                        continue  # refused, rolled back: retried as the streaming sink does
                else:
                    raise AssertionError("a write was refused 100 times")
                with lock:
                    if op == "delete":
                        oracle.delete(data.column("key").to_pylist())
                    else:
                        oracle.upsert(rows, instant)
                    committed[0] += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(me,)) for me in range(2)]
    for thread in threads:
        thread.start()
    executed = threading.Event()

    def runner(fn: Any, tasks: Any) -> list[Any]:
        out = local_runner(fn, tasks)
        if not executed.is_set():
            executed.set()
            with lock:
                target = committed[0] + 3
            while not errors:  # let writers commit on the input groups meanwhile
                with lock:
                    if committed[0] >= target:
                        break
                stop.wait(0.01)
        return out

    try:
        run = table.cluster(runner=runner)
        with lock:
            target = committed[0] + 2
        while not errors:
            with lock:
                if committed[0] >= target:
                    break
            stop.wait(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors
    assert run.completed
    assert run.details["carried_over_groups"] >= 1
    _check(table, oracle)


def test_clustering_input_file_gone_fails_as_clustering_error_and_plan_runs_again(
        tmp_path: Path) -> None:
    # A clustering whose input base file vanished (hand-deleted here; in the stress test, the
    # cleaner's, after another executor completed the same plan) fails with ClusteringError
    # naming the missing file, not a bare FileNotFoundError, and the attempt is reverted.
    from engine.services.clustering import ClusteringError

    table, _, _ = _make(tmp_path / "t", "COPY_ON_WRITE")
    instant = table.cluster(schedule_only=True).scheduled
    assert instant is not None
    for base in list_table_files(table.storage).base_files:
        (tmp_path / "t" / base.path).unlink()
    with pytest.raises(ClusteringError) as caught:
        table.cluster(instant=instant)
    assert "FileNotFoundError" in str(caught.value) and instant in str(caught.value)
    states = {e.instant_time: e.state for e in table.timeline()}
    assert states.get(instant) != "completed"
