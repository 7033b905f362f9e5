"""Write markers (``engine/layout/markers.py``): a task attempt SIGKILLed after it began its data
file is named by its marker, so the commit removes what it left — the whole file, or the
half-written temporary — and a rollback finds an instant's files through its markers."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.layout import markers
from engine.timeline.active import Timeline, temp_folder
from engine.write.group_writer import UPSERT
from engine.write.write_client import WriteClient
from engine.write.write_handle import execute
from tests.helpers import hudi_rs_read, row_tuples

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ("key", "v")

# The task attempt runs in its own process and SIGKILLs itself at the point named: just
# before or after the storage call that publishes its data file (written whole under a
# temporary name first), not one of ``.hoodie`` (its marker).
CHILD = textwrap.dedent("""
    import os, pickle, signal, sys
    from engine import storage
    from engine.write.write_handle import execute
    when, job = sys.argv[1], sys.argv[2]
    with open(job, "rb") as fh:
        context, task = pickle.load(fh)
    original = storage.LocalStorage.publish
    def publish(self, temp, rel, **kwargs):
        data_file = not rel.startswith(".hoodie/")
        if data_file and when == "before_publish":
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, temp, rel, **kwargs)
        if data_file:
            os.kill(os.getpid(), signal.SIGKILL)
    storage.LocalStorage.publish = publish
    execute(context, task, sync=True)
    print("not killed")
""")


def _rows(keys: list[str], v: int) -> pa.Table:
    return pa.table({"key": keys, "ts": [v] * len(keys), "part": [k[0] for k in keys],
                     "v": [v] * len(keys)})


def _files(path: str) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*")
                  if p.is_file() and ".hoodie" not in p.parts)


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
@pytest.mark.parametrize("when", ["before_publish", "after_publish"])
def test_killed_task_attempt_file_removed_at_commit_through_its_marker(
        tmp_path: Path, table_type: str, when: str) -> None:
    path = str(tmp_path / "t")
    table = Table.create(path, name="markers", table_type=table_type, record_key="key",
                         precombine="ts", partition_by=["part"])
    first = [f"{p}{i}" for p in "abc" for i in range(20)]
    table.upsert(_rows(first, 1))
    before = row_tuples(table.read(), COLUMNS)
    files_before = _files(path)

    client = WriteClient(table.storage, table.config, table.write_config)
    seen = Timeline.load(table.storage, table.config)
    records, deletes = client.prepare(_rows([f"{p}{i}" for p in "ab" for i in range(0, 40, 3)],
                                            2), seen, dedupe=True)
    timeline, instant = client.begin(seen=seen)
    plan = client.plan(timeline, instant, UPSERT, records, deletes)
    assert plan.context.markers and len(plan.tasks) == 2
    dying = plan.tasks[0]
    job = tmp_path / "task.pickle"
    job.write_bytes(pickle.dumps((plan.context, dying)))
    proc = subprocess.run([sys.executable, "-c", CHILD, when, str(job)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    marked = markers.marked_files(table.storage, instant.requested_time)
    assert marked is not None and len(marked) == 1
    left = [f for f in _files(path) if f not in files_before]
    assert left and all(f.endswith(marked[0].rpartition("/")[2]) for f in left), left
    # The pending instant's markers and files disturb no reader.
    assert row_tuples(table.read(), COLUMNS) == before
    assert row_tuples(hudi_rs_read(path), COLUMNS) == before

    # The retried attempt and the other task write, then the driver commits.
    stats = [execute(plan.context, replace(dying, attempt=1), sync=True),
             *(execute(plan.context, task, sync=True) for task in plan.tasks[1:])]
    client.commit(timeline, plan, stats, in_process=False)

    expected = dict(before)
    expected.update({k: 2 for k in records.column("key").to_pylist()})
    assert row_tuples(table.read(), COLUMNS) == sorted(expected.items())
    assert row_tuples(hudi_rs_read(path), COLUMNS) == sorted(expected.items())
    # Nothing of the killed attempt is left, not even a half-written temporary; the
    # instant's markers went with the commit.
    written = {s.path for s in stats}
    assert not [f for f in _files(path) if f not in files_before and f not in written]
    assert not table.storage.exists(temp_folder(instant.requested_time))
    assert table.validate_metadata().ok


def test_rollback_deletes_the_files_the_markers_name(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = Table.create(path, name="markers", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", partition_by=["part"])
    table.upsert(_rows(["a1", "b1"], 1))
    before = row_tuples(table.read(), COLUMNS)
    files_before = _files(path)
    client = WriteClient(table.storage, table.config, table.write_config)
    seen = Timeline.load(table.storage, table.config)
    records, deletes = client.prepare(_rows(["a1", "b2", "a3"], 2), seen, dedupe=True)
    timeline, instant = client.begin(seen=seen)
    plan = client.plan(timeline, instant, UPSERT, records, deletes)
    stats = [execute(plan.context, task, sync=True) for task in plan.tasks]
    assert markers.marked_files(table.storage, instant.requested_time) \
        == sorted(s.path for s in stats)
    client.abort(instant)
    assert _files(path) == files_before
    assert not table.storage.exists(temp_folder(instant.requested_time))
    rollback = next(e for e in table.timeline() if e.action == "rollback")
    assert rollback.state == "completed"
    assert row_tuples(table.read(), COLUMNS) == before
    assert row_tuples(hudi_rs_read(path), COLUMNS) == before
