"""A writer killed with SIGKILL mid-write leaves nothing visible; the next write rolls back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Table
from engine.metadata.table import MetadataTable
from engine.metadata.writer import MAX_DELTA_COMMITS
from tests.helpers import assert_hudi_rs_uses_metadata, hudi_rs_read, row_tuples
from tests.s3 import S3Location
from tests.soak import soak

COLUMNS = ("key", "v")

ROOT = Path(__file__).resolve().parents[2]

# Each crash point patches one engine function in the child process so that the process
# SIGKILLs itself there: no hook in the engine, a real kill at a real point of the write.
CRASH_POINTS = {
    "after_requested": ("engine.timeline.active", "Timeline", "transition_to_inflight",
                        "before"),
    "after_some_files": ("engine.write.write_client", "-", "execute", "before"),
    "before_complete": ("engine.write.write_client", "WriteClient", "commit", "before"),
    # The metadata table's deltacommit completed, the data instant not (Hudi's window).
    "after_mdt_deltacommit": ("engine.metadata.sync", "-", "write_deltacommit", "after"),
    # Inside the metadata table's compaction: plan and inflight written, no base file yet.
    "during_mdt_compaction": ("engine.metadata.writer", "-", "base_file_bytes", "before"),
}

CHILD = textwrap.dedent("""
    import importlib, os, signal, sys
    import pyarrow as pa
    from engine import Table
    module_name, cls_name, attr, when, path = sys.argv[1:6]
    crash_after_calls = int(sys.argv[6])
    module = importlib.import_module(module_name)
    owner = module if cls_name == "-" else getattr(module, cls_name)
    original = getattr(owner, attr)
    calls = [0]
    def crashing(*args, **kwargs):
        calls[0] += 1
        if calls[0] > crash_after_calls and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(*args, **kwargs)
        if calls[0] > crash_after_calls:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    setattr(owner, attr, crashing)
    t = Table.open(path)
    keys = [f"k{i:03d}" for i in range(0, 60, 2)] + [f"n{i:03d}" for i in range(30)]
    t.upsert(pa.table({"key": keys, "ts": [100] * len(keys),
                       "part": [k[-1] for k in keys], "v": list(range(len(keys)))}))
    print("not killed")
""")


@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_sigkill_mid_write_is_rolled_back_by_next_write(tmp_path: Path, table_type: str,
                                                         point: str) -> None:
    path = str(tmp_path / "t")
    table = Table.create(path, name="crash", table_type=table_type, record_key="key",
                         precombine="ts", partition_by=["part"],
                         options={"hoodie.parquet.max.file.size": "4000",
                                  "hoodie.parquet.small.file.limit": "1000"})
    keys = [f"k{i:03d}" for i in range(60)]
    table.upsert(pa.table({"key": keys, "ts": [1] * 60, "part": [k[-1] for k in keys],
                           "v": [-1] * 60}))
    if point == "during_mdt_compaction":  # 10 MDT deltacommits: the next write compacts
        for i in range(MAX_DELTA_COMMITS - 1):
            table.upsert(pa.table({"key": [f"k{i:03d}"], "ts": [2], "part": [str(i)],
                                   "v": [-2]}))
    before = row_tuples(table.read(), COLUMNS)
    # "after_some_files" lets one file group be written, then dies in the second.
    calls = 1 if point == "after_some_files" else 0
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", CHILD, *CRASH_POINTS[point], path, str(calls)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    states = {e.state for e in table.timeline()}
    assert states & {"requested", "inflight"}, "the crash must leave a pending instant"
    mdt_pending = [i for i in MetadataTable(table.storage, table.config).timeline().instants
                   if not i.is_completed]
    if point == "after_mdt_deltacommit":
        failed = next(e.instant_time for e in table.timeline() if e.state != "completed")
        assert any(i.requested_time == failed and i.is_completed for i in
                   MetadataTable(table.storage, table.config).timeline().instants)
    if point == "during_mdt_compaction":
        assert [i.action.value for i in mdt_pending] == ["compaction"]
    # Nothing of the crashed write is visible to either reader.
    assert row_tuples(table.read(), COLUMNS) == before
    assert row_tuples(hudi_rs_read(path), COLUMNS) == before
    # The dead writer's heartbeat is still fresh, but it names a process of this machine
    # that provably ended: the next writer rolls the instant back at once (a writer that
    # may be alive elsewhere waits for the expiry: tests/engine/test_ownership.py), then
    # commits normally.
    reopened = Table.open(path)
    reopened.upsert(pa.table({"key": ["z999"], "ts": [5], "part": ["9"], "v": [7]}))
    after = row_tuples(reopened.read(), COLUMNS)
    assert after == sorted([*before, ("z999", 7)])
    assert row_tuples(hudi_rs_read(path), COLUMNS) == after
    timeline = reopened.timeline()
    assert all(e.state == "completed" for e in timeline)
    assert any(e.action == "rollback" for e in timeline)
    leftovers = [p.name for p in Path(path).rglob("*") if p.name.startswith(".tmp.")]
    assert leftovers == []
    assert not list(Path(path, ".hoodie", ".heartbeat").iterdir())
    # The metadata table agrees with storage again, and hudi-rs lists through it.
    assert reopened.validate_metadata().ok
    assert all(i.is_completed for i in MetadataTable(table.storage, table.config)
               .timeline().instants)
    assert_hudi_rs_uses_metadata(path, tmp_path / "decoy")


@pytest.mark.parametrize("point", soak(["before_complete"],
                                      ["after_some_files", "before_complete"]))
def test_sigkill_mid_write_on_s3_is_rolled_back_by_next_write(s3: S3Location,
                                                              point: str) -> None:
    # The same kill on an s3:// table (moto on loopback); the child finds the store through
    # the environment alone (AWS_*), as a job would.
    path = s3.uri()
    options = s3.storage_options
    table = Table.create(path, name="crash", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", partition_by=["part"],
                         options={"hoodie.parquet.max.file.size": "4000",
                                  "hoodie.parquet.small.file.limit": "1000"},
                         storage_options=options)
    keys = [f"k{i:03d}" for i in range(60)]
    table.upsert(pa.table({"key": keys, "ts": [1] * 60, "part": [k[-1] for k in keys],
                           "v": [-1] * 60}))
    before = row_tuples(table.read(), COLUMNS)
    calls = 1 if point == "after_some_files" else 0
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               **{key.upper(): value for key, value in options.items()})
    proc = subprocess.run([sys.executable, "-c", CHILD, *CRASH_POINTS[point], path, str(calls)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert {e.state for e in table.timeline()} & {"requested", "inflight"}
    assert row_tuples(table.read(), COLUMNS) == before
    assert row_tuples(hudi_rs_read(path, storage_options=options), COLUMNS) == before
    reopened = Table.open(path, storage_options=options)
    reopened.upsert(pa.table({"key": ["z999"], "ts": [5], "part": ["9"], "v": [7]}))
    after = row_tuples(reopened.read(), COLUMNS)
    assert after == sorted([*before, ("z999", 7)])
    assert row_tuples(hudi_rs_read(path, storage_options=options), COLUMNS) == after
    timeline = reopened.timeline()
    assert all(e.state == "completed" for e in timeline)
    assert any(e.action == "rollback" for e in timeline)
    assert reopened.storage.list_dir(".hoodie/.heartbeat") == []
    assert reopened.validate_metadata().ok


def test_unreadable_rollback_plan_fails_loudly_naming_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = Table.create(path, name="crash", table_type="MERGE_ON_READ", record_key="key",
                         precombine="ts", partition_by=["part"])
    table.upsert(pa.table({"key": ["a"], "ts": [1], "part": ["x"], "v": [1]}))
    # A rollback left pending whose plan is damaged: its target cannot be known, so it must
    # not be guessed ("no target") and finished as if it were harmless.
    plan = Path(path, ".hoodie", "timeline", "20990101000000000.rollback.requested")
    plan.write_bytes(b"Obj\x01 damaged")
    from engine.errors import CorruptTableError
    with pytest.raises(CorruptTableError, match=r"20990101000000000\.rollback\.requested"):
        Table.open(path).upsert(pa.table({"key": ["b"], "ts": [1], "part": ["x"], "v": [2]}))
    assert row_tuples(Table.open(path).read(), COLUMNS) == [("a", 1)]
