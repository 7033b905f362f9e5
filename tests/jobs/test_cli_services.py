"""``tidelake table compact|cluster|clean|archive|savepoint`` and the services part of ``show``,
on real tables written with the engine; outputs and the table state afterwards are checked,
snapshots against a dict oracle and hudi-rs."""

from __future__ import annotations

import random
import re
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.layout.file_group import list_table_files
from engine.services.base import ServiceRun
from jobs.cli import main
from jobs.table_commands import ProgressRunner, summary_line
from tests.helpers import Oracle, hudi_rs_read, row_tuples

CITIES = ["oslo", "lima", "pune"]


COLUMNS = ("id", "ts", "city", "fare")


def _write(path: Path, batches: int, *, table_type: str = "MERGE_ON_READ",
           options: dict[str, str] | None = None, size: int = 60,
           seed: int = 3) -> tuple[Table, Oracle]:
    """A table written in ``batches`` upserts of random keys (updates and inserts)."""
    rng = random.Random(seed)
    opts = {"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": "2",
            "hoodie.clean.automatic": "false", "hoodie.archive.automatic": "false"}
    opts.update(options or {})
    table = Table.create(str(path), name="trips", table_type=table_type, record_key="id",
                         precombine="ts", partition_by=["city"], options=opts)
    oracle = Oracle(key="id")  # every batch here has larger ts
    for b in range(batches):
        batch = [{"id": f"k{rng.randrange(size * 2):04d}", "ts": b * 1000 + i,
                  "fare": round(rng.uniform(1, 90), 2)} for i in range(size)]
        for row in batch:  # a key keeps its partition
            row["city"] = CITIES[int(row["id"][1:]) % len(CITIES)]
        table.upsert(pa.Table.from_pylist(batch))
        oracle.upsert(batch)
    return table, oracle


def _check_snapshot(path: Path, oracle: Oracle) -> None:
    expected = row_tuples(oracle.snapshot(), COLUMNS)
    assert row_tuples(Table.open(str(path)).read(), COLUMNS) == expected
    assert row_tuples(hudi_rs_read(path), COLUMNS) == expected


# -- without services -----------------------------------------------------------------------


def test_progress_runner_prints_each_finished_task_and_keeps_order(
        capsys: pytest.CaptureFixture[str]) -> None:
    class Task:
        def __init__(self, n: int) -> None:
            self.n = n
            self.instant_time = "20261123101112131"

    gate = threading.Event()

    def work(task: Task) -> int:
        if task.n == 0:
            gate.wait(5)  # the second task finishes first: results still come in order
        else:
            gate.set()
        return task.n * 10

    runner = ProgressRunner("compaction")
    assert runner(work, [Task(0), Task(1), Task(2)]) == [0, 10, 20]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "compaction 20261123101112131: 0/3 file groups"
    assert [re.sub(r" \(.*\)$", "", x) for x in lines[1:]] == [
        f"compaction 20261123101112131: {i}/3 file groups" for i in (1, 2, 3)]
    assert runner.tasks_run == 3


def test_summary_line_names_instants_counts_and_time() -> None:
    run = ServiceRun("compaction", scheduled="20261123000000001",
                     completed=("20261123000000001",),
                     details={"file_groups": 12, "rows": 200_000})
    assert summary_line(run, 3.2) == ("compaction: scheduled 20261123000000001; completed "
                                      "20261123000000001 (12 file groups, 200,000 rows) "
                                      "in 3.20 s")
    assert summary_line(ServiceRun("clean"), 0.01) == "clean: nothing to do in 0.01 s"
    archived = tuple(f"2026112300000000{i}" for i in range(5))
    assert summary_line(ServiceRun("archive", completed=archived,
                                   details={"instants_archived": 5, "commits_archived": 4}),
                        1) == ("archive: archived 5 instants (20261123000000000 … "
                               "20261123000000004) (4 commits archived) in 1.00 s")
    assert summary_line(ServiceRun("clustering", scheduled="20261123000000002",
                                   details={"groups": 0}), 0.5,
                        schedule_only=True) == (
        "clustering: scheduled 20261123000000002; not executed (--schedule-only) in 0.50 s")


@pytest.mark.parametrize("flag, message", [
    (["--set", "hoodie.cleaner.commits.retained"], "--set: expected key=value"),
    (["--set", "hoodie.no.such.key=1"], "option 'hoodie.no.such.key': unknown option"),
    (["--retain-commits", "0"], "option 'hoodie.cleaner.commits.retained': must be positive"),
])
def test_clean_bad_option_is_a_one_line_error_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str],
        message: str) -> None:
    _write(tmp_path / "t", 2)
    before = sorted(p.name for p in (tmp_path / "t" / ".hoodie" / "timeline").iterdir())
    assert main(["table", "clean", str(tmp_path / "t"), *flag]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("tidelake: error: ") and message in err[0]
    assert sorted(p.name for p in (tmp_path / "t" / ".hoodie" / "timeline").iterdir()) == before


def test_service_on_missing_table_exits_2(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "compact", str(tmp_path / "none")]) == 2
    assert "no Hudi table" in capsys.readouterr().err


def test_show_file_group_table_counts_slices_and_logs_and_truncates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table, _ = _write(tmp_path / "t", 3)
    assert main(["table", "show", str(tmp_path / "t"), "--groups", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    files = list_table_files(table.storage)
    groups = {(f.partition_path, f.file_id) for f in [*files.base_files, *files.log_files]}
    head = out.index(next(x for x in out if x.startswith("file groups:")))
    assert out[head] == f"file groups: {len(groups)} in 3 partition(s)"
    assert out[head + 1].split() == ["partition", "slices", "logs", "bytes", "base", "file"]
    rows = out[head + 2: head + 4]
    for row in rows:
        partition, slices, logs, size, *_ = row.split()
        assert partition in CITIES and slices == "1"
        # the oracle: log files of that group on storage (3 deltacommits, one slice)
        fid = row.split()[-1]
        assert int(logs) == sum(1 for f in files.log_files if f.file_id == fid)
        assert int(size.replace(",", "")) == sum(
            f.size for f in files.log_files if f.file_id == fid)
    assert out[head + 4] == f"  … {len(groups) - 2} more"
    assert "pending services:" in out and out[out.index("pending services:") + 1] == "  none"


# -- with the services merged -----------------------------------------------------------------


def test_compact_prints_progress_and_summary_and_compacts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t"
    table, oracle = _write(path, 3)
    groups = len(table.file_slices())
    assert main(["table", "compact", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    match = re.fullmatch(r"compaction: scheduled (\d{17}); completed \1 \((\d+) file groups, "
                         r"([\d,]+) rows\) in \d+\.\d\d s", out[-1])
    assert match, out[-1]
    instant = match.group(1)
    assert int(match.group(2)) == groups
    assert int(match.group(3).replace(",", "")) == len(oracle.rows)
    assert out[0] == f"compaction {instant}: 0/{groups} file groups"
    assert [re.sub(r" \(\d+\.\d s\)$", "", x) for x in out[1:-1]] == [
        f"compaction {instant}: {i}/{groups} file groups" for i in range(1, groups + 1)]
    done = Table.open(str(path)).timeline()
    assert any(e.instant_time == instant and e.state == "completed" for e in done)
    after = Table.open(str(path)).file_slices()
    assert all(s.base_file is not None and not s.log_files for s in after)
    _check_snapshot(path, oracle)


def test_compact_schedule_only_then_instant_shows_pending_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t"
    table, oracle = _write(path, 2)
    groups = len(table.file_slices())
    assert main(["table", "compact", str(path), "--schedule-only"]) == 0
    line = capsys.readouterr().out.strip()
    match = re.fullmatch(r"compaction: scheduled (\d{17}); not executed \(--schedule-only\)"
                         r".* in \d+\.\d\d s", line)
    assert match, line
    instant = match.group(1)
    assert main(["table", "show", str(path)]) == 0
    shown = capsys.readouterr().out.splitlines()
    pending = shown[shown.index("pending services:") + 1]
    assert pending.split()[:3] == [instant, "compaction", "requested"]
    assert pending.endswith(f"{groups} file group(s)")
    _check_snapshot(path, oracle)  # a pending plan changes no read
    assert main(["table", "compact", str(path), "--instant", instant]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        f"compaction: completed {instant}")
    assert main(["table", "show", str(path)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[shown.index("pending services:") + 1] == "  none"
    _check_snapshot(path, oracle)


def test_compact_copy_on_write_is_a_clear_error(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "t", 1, table_type="COPY_ON_WRITE")
    assert main(["table", "compact", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "COPY_ON_WRITE" in err[0]


def test_clean_retain_commits_deletes_old_slices_and_show_reports_earliest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t"
    table, oracle = _write(path, 6, table_type="COPY_ON_WRITE")
    before = len(list_table_files(table.storage).base_files)
    assert main(["table", "clean", str(path), "--retain-commits", "2"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.match(r"clean: scheduled (\d{17}); completed \1", line), line
    after = list_table_files(Table.open(str(path)).storage).base_files
    live = {s.base_file.name for s in Table.open(str(path)).file_slices() if s.base_file}
    assert live <= {f.name for f in after} and len(after) < before
    _check_snapshot(path, oracle)
    assert main(["table", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    from engine.services.clean import earliest_readable_instant
    from engine.timeline.active import Timeline

    earliest = earliest_readable_instant(Timeline.load(table.storage, table.config))
    assert earliest is not None
    assert f"earliest readable instant: {earliest} (" in shown


def test_archive_moves_instants_to_history_and_show_counts_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t"
    _, oracle = _write(path, 14, table_type="COPY_ON_WRITE", size=10)
    before = len(Table.open(str(path)).timeline())
    assert main(["table", "archive", str(path), "--set", "hoodie.keep.min.commits=3",
                 "--set", "hoodie.keep.max.commits=5"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("archive: ") and "nothing to do" not in line, line
    active = len(Table.open(str(path)).timeline())
    assert active < before
    assert main(["table", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert f"archived instants: {before - active:,} (in .hoodie/timeline/history)" in shown
    _check_snapshot(path, oracle)


@pytest.mark.parametrize("layout", ["linear", "z-order", "hilbert"])
def test_cluster_sorts_by_named_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        layout: str) -> None:
    path = tmp_path / "t"
    _, oracle = _write(path, 4, table_type="COPY_ON_WRITE",
                       options={"hoodie.index.type": "SIMPLE"})
    assert main(["table", "cluster", str(path), "--sort-columns", "fare,ts",
                 "--layout", layout]) == 0
    out = capsys.readouterr().out.splitlines()
    match = re.match(r"clustering: scheduled (\d{17}); completed \1", out[-1])
    assert match, out
    assert any(x.startswith(f"clustering {match.group(1)}: ") for x in out[:-1])
    timeline = Table.open(str(path)).timeline()
    assert any(e.instant_time == match.group(1) and e.state == "completed" for e in timeline)
    _check_snapshot(path, oracle)
    if layout == "linear":  # each new file is sorted by fare
        import pyarrow.parquet as pq

        for slc in Table.open(str(path)).file_slices():
            assert slc.base_file is not None
            fares = pq.read_table(path / slc.base_file.path, columns=["fare"])["fare"]
            assert fares.to_pylist() == sorted(fares.to_pylist())


def test_savepoint_create_list_delete(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t"
    table, _ = _write(path, 3, table_type="COPY_ON_WRITE")
    commits = [e.instant_time for e in table.timeline() if e.state == "completed"]
    assert main(["table", "savepoint", str(path), commits[1], "--comment", "audit"]) == 0
    assert capsys.readouterr().out.startswith(f"savepoint {commits[1]} created")
    assert main(["table", "savepoint", str(path)]) == 0  # the latest commit
    assert capsys.readouterr().out.startswith(f"savepoint {commits[2]} created")
    assert main(["table", "savepoint", str(path), "--list"]) == 0
    assert capsys.readouterr().out.split() == [commits[1], commits[2]]
    assert main(["table", "show", str(path)]) == 0
    assert f"savepoints: {commits[1]}, {commits[2]}" in capsys.readouterr().out
    assert main(["table", "savepoint", str(path), "--delete", commits[1]]) == 0
    assert capsys.readouterr().out.strip() == f"savepoint {commits[1]} deleted"
    assert Table.open(str(path)).savepoints() == [commits[2]]
    assert main(["table", "savepoint", str(path), "--list", "--delete", commits[2]]) == 2
    assert "--list takes no instant" in capsys.readouterr().err


def test_show_tells_a_running_compaction_from_a_dead_attempt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.timeline.active import Timeline
    from engine.timeline.heartbeat import Heartbeat
    from engine.timeline.instant import Action

    path = tmp_path / "t"
    table, oracle = _write(path, 2)
    instant = table.compact(schedule_only=True).scheduled
    assert instant is not None
    timeline = Timeline.load(table.storage, table.config)
    pending = timeline.pending([Action.COMPACTION])[0]
    timeline.transition_to_inflight(pending)  # an executor started, then died
    assert main(["table", "show", str(path)]) == 0
    shown = capsys.readouterr().out.splitlines()
    line = shown[shown.index("pending services:") + 1]
    assert line.split()[:3] == [instant, "compaction", "inflight"]
    assert "(no live executor: the next run re-executes it)" in line
    beat = Heartbeat(table.storage, instant, 60).start()  # a live executor elsewhere
    try:
        assert main(["table", "show", str(path)]) == 0
        shown = capsys.readouterr().out.splitlines()
        assert re.search(r"inflight \(running: heartbeat \d+ s old\)",
                         shown[shown.index("pending services:") + 1])
    finally:
        beat.stop()
    assert main(["table", "compact", str(path)]) == 0  # re-executes the dead attempt
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"compaction: completed {instant}")
    _check_snapshot(path, oracle)


def test_cluster_bucket_table_does_nothing_and_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t"
    _, oracle = _write(path, 2)
    before = sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir())
    assert main(["table", "cluster", str(path), "--sort-columns", "fare"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"clustering: nothing to do in \d+\.\d\d s \(BUCKET-index tables are "
                        r"never clustered: a key's bucket is its file group\)", line), line
    assert sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir()) == before
    _check_snapshot(path, oracle)
