"""Differential property test of the table services: random writes interleaved with
compaction, clustering (each sort strategy), cleaning and archival — scheduled and executed
separately — and with SIGKILLs of a service or a write at a random storage operation.

After every step our snapshot read and hudi-rs's equal the oracle. At the end, time travel and
incremental reads equal the oracle within the range the cleaner kept, and raise
``InstantNotReadableError`` naming the earliest readable instant outside it. Services run with
small retention so that every one of them acts within a short sequence.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import InstantNotReadableError, Table
from engine.services.clean import earliest_readable_instant
from engine.timeline.active import Timeline
from tests.engine.helpers import COLUMNS, SCHEMA, random_batch
from tests.helpers import (
    Oracle,
    assert_hudi_rs_uses_metadata,
    assert_metadata_in_step,
    hudi_rs_read,
    sorted_rows,
)
from tests.soak import soak

ROOT = Path(__file__).resolve().parents[2]

SERVICE_OPTIONS = {
    "hoodie.clean.automatic": "false",
    "hoodie.archive.automatic": "false",
    "hoodie.cleaner.commits.retained": "4",
    "hoodie.keep.min.commits": "6",
    "hoodie.keep.max.commits": "9",
    "hoodie.compact.inline.max.delta.commits": "2",
    # a killed child's instants and attempts are taken over at once (its process provably
    # ended); the 2 s expiry keeps a live writer on a busy machine from missing its beat
    "hoodie.client.heartbeat.interval_in_ms": "200",
    "hoodie.client.heartbeat.tolerable.misses": "10",
    "hoodie.write.lock.filesystem.expire": "0.05",
    "hoodie.clustering.plan.strategy.sort.columns": "amount,ts",
}

# The child runs one action with every storage mutation counted; at the k-th it SIGKILLs
# itself: a real kill at a real point of the service, with no hook in the engine.
CHILD = textwrap.dedent("""
    import json, os, signal, sys
    import pyarrow as pa
    from engine import Table
    from engine.storage import LocalStorage as Storage
    path, action, options, kill_at, payload = sys.argv[1:6]
    kill_at = int(kill_at)
    calls = [0]
    for name in ("write_new", "write_replace", "delete", "rename"):
        original = getattr(Storage, name, None)
        if original is None:
            continue
        def counted(self, *a, _original=original, **kw):
            calls[0] += 1
            if calls[0] >= kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return _original(self, *a, **kw)
        setattr(Storage, name, counted)
    t = Table.open(path, json.loads(options))
    if action == "upsert":
        t.upsert(pa.Table.from_pylist(json.loads(payload)))
    elif action == "compact":
        t.compact()
    elif action == "cluster":
        t.cluster()
    elif action == "clean":
        t.clean()
    elif action == "archive":
        t.archive()
    print("not killed")
""")


def _check(table: Table, oracle: Oracle, where: str) -> None:
    expected = oracle.snapshot()
    assert sorted_rows(table.read(), COLUMNS) == expected, where
    assert sorted_rows(hudi_rs_read(table.path), COLUMNS) == expected, f"hudi-rs {where}"
    assert_metadata_in_step(table)


def _straddled(table: Table, instant: str) -> bool:
    """True if a table service requested before ``instant`` completed after it: hudi-rs
    0.5.0 time-travels by requested times and would read that service's files, which may
    hold later data (``hudi-table-services.md`` §2.2); our reader follows completion times."""
    entries = [e for e in table.timeline() if e.state == "completed" and e.completion_time]
    done = next((e.completion_time for e in entries if e.instant_time == instant), None)
    return done is not None and any(e.instant_time <= instant and e.completion_time > done
                                    for e in entries)


def _killed_child(table: Table, action: str, options: dict[str, str], kill_at: int,
                  payload: list[dict[str, Any]] | None = None) -> bool:
    """Run ``action`` in a child that SIGKILLs itself at its ``kill_at``-th storage
    mutation; True if it was killed (False: it finished first)."""
    import json

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    proc = subprocess.run([sys.executable, "-c", CHILD, table.path, action,
                           json.dumps(options), str(kill_at), json.dumps(payload or [])],
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        assert "not killed" in proc.stdout
        return False
    assert proc.returncode == -9, proc.stderr[-2000:]
    # What it left pending, and a table lock it died holding, are taken over by the next
    # writer or executor at once: their holder is provably gone (no wait for an expiry).
    return True


def _run(tmp_path: Path, seed: int, table_type: str, index: str, block_format: str,
         partitioned: bool, steps: int, extra_options: dict[str, str] | None = None) -> None:
    rng = random.Random(seed)
    options = {**SERVICE_OPTIONS, **(extra_options or {}), "hoodie.index.type": index,
               "hoodie.logfile.data.block.format": block_format,
               "hoodie.bucket.index.num.buckets": "2",
               "hoodie.parquet.max.file.size": "400000",
               "hoodie.parquet.small.file.limit": "340000",
               "hoodie.copyonwrite.record.size.estimate": "2000",
               "hoodie.layout.optimize.strategy": rng.choice(["linear", "z-order",
                                                              "hilbert"])}
    table = Table.create(str(tmp_path / "t"), name="svc", table_type=table_type,
                         record_key="key", precombine="ts",
                         partition_by=["region"] if partitioned else None, options=options)
    oracle, counter = Oracle(), [0]
    history: list[tuple[str, list[dict[str, Any]]]] = []
    done: dict[str, int] = {}

    def write() -> None:
        if rng.random() < 0.15 and oracle.rows:
            victims = rng.sample(sorted(oracle.rows), k=min(len(oracle.rows),
                                                             rng.randint(1, 8)))
            data = pa.table({"key": victims,
                             "region": [oracle.rows[k]["region"] for k in victims]})
            instant = table.delete(data)
            oracle.delete(victims)
        else:
            batch = random_batch(rng, oracle, counter, rng.randint(1, 50))
            for row in batch:  # the key's partition stays (no global index here)
                if row["key"] in oracle.rows:
                    row["region"] = oracle.rows[row["key"]]["region"]
            instant = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
            oracle.upsert(batch, instant)
        history.append((instant, oracle.snapshot()))

    for step in range(steps):
        roll = rng.random()
        where = f"step {step} (seed {seed})"
        if roll < 0.55 or not history:
            write()
            what = "write"
        elif roll < 0.65 and table_type == "MERGE_ON_READ":
            run = table.compact(schedule_only=rng.random() < 0.3)
            what = "compact"
            done["compact"] = done.get("compact", 0) + len(run.completed)
        elif roll < 0.72 and index != "BUCKET":
            table.write_config = table.write_config.__class__.from_options({
                **options, "hoodie.layout.optimize.strategy": rng.choice(
                    ["linear", "z-order", "hilbert"])})
            run = table.cluster(schedule_only=rng.random() < 0.3)
            what = "cluster"
            done["cluster"] = done.get("cluster", 0) + len(run.completed)
        elif roll < 0.82:
            run = table.clean()
            what = "clean"
            done["clean"] = done.get("clean", 0) + len(run.completed)
        elif roll < 0.88:
            run = table.archive()
            what = "archive"
            done["archive"] = done.get("archive", 0) + len(run.completed)
        else:
            action = rng.choice(["compact", "cluster", "clean", "archive", "upsert"])
            if action == "compact" and table_type != "MERGE_ON_READ":
                action = "clean"
            if action == "cluster" and index == "BUCKET":
                action = "archive"
            payload = None
            if action == "upsert":
                payload = random_batch(rng, oracle, counter, rng.randint(1, 20))
                for row in payload:
                    if row["key"] in oracle.rows:
                        row["region"] = oracle.rows[row["key"]]["region"]
            before = {e.instant_time for e in table.timeline() if e.state == "completed"}
            killed = _killed_child(table, action, options, rng.randint(1, 12), payload)
            what = f"{action} {'killed' if killed else 'not killed'}"
            if payload is not None:
                # killed after its commit point (deleting its heartbeat...), it is committed
                new = [e.instant_time for e in table.timeline() if e.state == "completed"
                       and e.instant_time not in before
                       and e.action in ("commit", "deltacommit")]
                assert len(new) <= 1, new
                if new:
                    oracle.upsert(payload, new[0])
                    history.append((new[0], oracle.snapshot()))
                else:
                    assert killed, "an upsert that was not killed committed nothing"
        _check(table, oracle, f"{where} after {what}")

    # Finish what is pending; the table is unchanged by it.
    if table_type == "MERGE_ON_READ":
        table.compact()
    if index != "BUCKET":
        table.cluster(instant=None)
    table.clean()
    table.archive()
    _check(table, oracle, "after the final services")
    pending = [e for e in table.timeline() if e.state != "completed"]
    assert not pending, pending
    if assert_metadata_in_step(table):  # hudi-rs listed through our metadata table
        assert_hudi_rs_uses_metadata(table.path, tmp_path / "decoy")

    timeline = Timeline.load(table.storage, table.config)
    earliest = earliest_readable_instant(timeline)
    active = {e.instant_time for e in table.timeline()}
    for instant, expected in history:
        if earliest is not None and instant < earliest:
            with pytest.raises(InstantNotReadableError, match=earliest):
                table.read(as_of=instant)
            continue
        assert sorted_rows(table.read(as_of=instant), COLUMNS) == expected, f"as_of {instant}"
        if instant in active and not _straddled(table, instant):
            assert sorted_rows(hudi_rs_read(table.path, as_of=instant), COLUMNS) == expected, \
                f"hudi-rs as_of {instant}"

    # Incremental reads between two commits still on the active timeline and readable.
    completions = {e.instant_time: e.completion_time for e in table.timeline()
                   if e.state == "completed"}
    instants = [i for i, _ in history]
    readable = [n for n, i in enumerate(instants)
                if i in completions and (earliest is None or i >= earliest)]
    for _ in range(4):
        if len(readable) < 2:
            break
        i, j = sorted(rng.sample(readable, 2))
        start, end = completions[instants[i]], completions[instants[j]]
        in_range = set(instants[i + 1:j + 1])
        expected = [r for r in history[j][1] if r["_hoodie_commit_time"] in in_range]
        assert sorted_rows(table.read_incremental(start, end), COLUMNS) == expected, (start, end)
    if earliest is not None and instants[0] < earliest:
        with pytest.raises(InstantNotReadableError, match=earliest):
            table.read_incremental(instants[0])


CASES = [
    ("COPY_ON_WRITE", "SIMPLE", "avro", True),
    ("MERGE_ON_READ", "SIMPLE", "avro", True),
    ("MERGE_ON_READ", "SIMPLE", "parquet", False),
    ("MERGE_ON_READ", "BUCKET", "avro", True),
    ("COPY_ON_WRITE", "SIMPLE", "avro", False),
]


@pytest.mark.parametrize(("table_type", "index", "block_format", "partitioned"), CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_services_interleaved_with_writes_and_kills_match_oracle(
        tmp_path: Path, table_type: str, index: str, block_format: str,
        partitioned: bool) -> None:
    _run(tmp_path, 1000 + CASES.index((table_type, index, block_format, partitioned)),
         table_type, index, block_format, partitioned, steps=30)


def test_services_table_version_9_interleaved_with_writes_and_kills_match_oracle(
        tmp_path: Path) -> None:
    """One shape at table version 9 (docs/table-version-9.md): compaction, clustering,
    clean, archival and killed attempts over a metadata table of Hudi 1.1's layout."""
    _run(tmp_path, 1900, "MERGE_ON_READ", "SIMPLE", "avro", True, steps=30,
         extra_options={"hoodie.write.table.version": "9",
                        "hoodie.metadata.index.column.stats.enable": "true"})


@pytest.mark.slow
@pytest.mark.parametrize("seed", soak(range(1), range(6)))  # each case runs above already
def test_services_many_seeds(tmp_path: Path, seed: int) -> None:
    table_type, index, block_format, partitioned = CASES[seed % len(CASES)]
    _run(tmp_path, 2000 + seed, table_type, index, block_format, partitioned, steps=70)
