"""Helpers of the job-level ingest tests (end to end, crash, standalone cluster).

* :class:`KeyedStream` — :class:`jobs.sample_events.SampleEvents` produced *keyed* (all versions
  of a key in one Kafka partition, as a keyed producer does), remembering each record's offset,
  so the oracle of any prefix of the topic is known exactly: :meth:`KeyedStream.oracle` of the
  offsets a table recorded is what that table must hold.
* :func:`table_problems` — a table and its error table against the oracle: our reader, hudi-rs,
  no duplicate keys, the error table holding the malformed records with the right reasons.
* :func:`job_settings`, :func:`write_job` — a job's settings and its TOML file.
* :class:`ChildJob` — the job as a child process (:mod:`tests.ingest.job_child`), with its
  whole process tree killed by SIGKILL on demand.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import Table
from engine.timeline.active import Timeline
from ingest.checkpoint import QUERY_ID_KEY, SINK_CHECKPOINT_KEY, starting_offsets_from_table
from ingest.kafka_produce import create_topic, produce
from jobs.sample_events import SCHEMA_DDL, SampleEvents
from tests.helpers import hudi_rs_read, rows_by_key

REPO = Path(__file__).resolve().parents[2]
COLUMNS = ("trip_id", "ts", "city", "fare", "rider")
Row = tuple[Any, ...]


# --- the stream and its oracle --------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One record as produced: key, value, Kafka partition and offset."""

    key: bytes
    value: bytes
    partition: int
    offset: int


class KeyedStream:
    """``count`` sample events for ``topic``, sent in slices with :meth:`send`."""

    def __init__(self, bootstrap: str, topic: str, count: int, *, partitions: int = 3,
                 seed: int = 11) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.events = SampleEvents(count, seed=seed)
        self._pending = list(self.events)  # generates everything; fills .expected/.malformed
        self._bad = set(self.events.malformed)
        self.sent: list[Sent] = []
        create_topic(bootstrap, topic, partitions)

    @property
    def remaining(self) -> int:
        """Events not sent yet."""
        return len(self._pending)

    def send(self, n: int | None = None) -> int:
        """Produce the next ``n`` events (all that remain by default); returns how many."""
        n = len(self._pending) if n is None else min(n, len(self._pending))
        batch, self._pending = self._pending[:n], self._pending[n:]
        records = [(k, v, zlib.crc32(k) % self.partitions) for k, v in batch]
        offsets = produce(self.bootstrap, self.topic, records) if records else []
        self.sent += [Sent(k, v, p, o) for (k, v, p), o in zip(records, offsets, strict=True)]
        return n

    def end_offsets(self) -> dict[int, int]:
        """Next offset per partition after everything sent."""
        ends: dict[int, int] = {}
        for s in self.sent:
            ends[s.partition] = max(ends.get(s.partition, 0), s.offset + 1)
        return ends

    def _taken(self, upto: Mapping[int, int] | None) -> list[Sent]:
        if upto is None:
            return self.sent
        return [s for s in self.sent if s.offset < upto.get(s.partition, 0)]

    def is_malformed(self, s: Sent) -> bool:
        """True if ``s`` is one of the malformed records."""
        return (s.key, s.value) in self._bad

    def oracle(self, upto: Mapping[int, int] | None = None) -> dict[str, Row]:
        """Live rows (``COLUMNS``) after the records below ``upto`` (all sent by default).

        Every event carries a larger ``ts`` than the one before, so each record simply
        replaces (or, with ``_hoodie_is_deleted``, deletes) its key.
        """
        rows: dict[str, Row] = {}
        for s in self._taken(upto):
            if self.is_malformed(s):
                continue
            record = json.loads(s.value)
            if record.get("_hoodie_is_deleted"):
                rows.pop(record["trip_id"], None)
            else:
                rows[record["trip_id"]] = tuple(record[c] for c in COLUMNS)
        return rows

    def malformed(self, upto: Mapping[int, int] | None = None) -> list[Sent]:
        """The malformed records below ``upto`` (all sent by default)."""
        return [s for s in self._taken(upto) if self.is_malformed(s)]


def expected_reason(value: bytes) -> str:
    """The start of the reason the error table must give for a malformed sample value."""
    try:
        record = json.loads(value)
    except ValueError:
        return "cannot decode the value: invalid JSON"
    if "trip_id" not in record:
        return "record key field 'trip_id' is null or empty"
    if isinstance(record.get("ts"), str):
        return "cannot decode the value: field 'ts': expected BIGINT"
    return "partition value for 'city' is too long for a folder name"


# --- reading tables back --------------------------------------------------------------------


def read_rows(path: str | Path) -> tuple[dict[str, Row], list[str]]:
    """Our reader's rows by key, and the keys stored more than once (none before the sink
    created the table: it does so with its first valid micro-batch)."""
    if not (Path(path) / ".hoodie" / "hoodie.properties").exists():
        return {}, []
    data = Table.open(str(path)).read(columns=list(COLUMNS)).to_pylist()
    counts = Counter(r["trip_id"] for r in data)
    return ({r["trip_id"]: tuple(r[c] for c in COLUMNS) for r in data},
            sorted(k for k, c in counts.items() if c > 1))


def hudi_rs_trips(path: str | Path) -> tuple[dict[str, Row], int]:
    """hudi-rs's rows by key, and how many rows it returned."""
    if not (Path(path) / ".hoodie" / "hoodie.properties").exists():
        return {}, 0
    data = hudi_rs_read(path)
    return rows_by_key(data, "trip_id", COLUMNS), data.num_rows


def committed_offsets(path: str | Path, topic: str,
                      identifier: str | None = None) -> dict[int, int]:
    """Next offset per partition recorded by the table's newest streaming commit (of the
    job with writer ``identifier``, if given)."""
    return dict((starting_offsets_from_table(str(path), identifier) or {}).get(topic, {}))


def streaming_commits(path: str | Path) -> list[tuple[str | None, int]]:
    """(query id, batch id) of every completed commit of the sink, oldest first (commits of
    table services — compactions, clusterings — carry the newest batch's checkpoint forward
    and are not batches)."""
    table = Table.open(str(path))
    timeline = Timeline.load(table.storage, table.config)
    out = []
    for instant in timeline.completed_data_instants:
        meta = timeline.commit_metadata(instant)
        if meta.compacted or meta.operation_type in ("COMPACT", "CLUSTER"):
            continue
        extra = meta.extra_metadata
        batch = json.loads(extra[SINK_CHECKPOINT_KEY])["default_single_writer"]
        out.append((extra.get(QUERY_ID_KEY), int(batch)))
    return out


def pending_instants(path: str | Path) -> list[str]:
    """Instants of the table's timeline that are not completed (requested or inflight)."""
    return [f"{e.instant_time} {e.action} {e.state}" for e in Table.open(str(path)).timeline()
            if e.state != "completed"]


def _diff(name: str, got: Mapping[str, Row], want: Mapping[str, Row]) -> str | None:
    if got == want:
        return None
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    sample = {k: (got[k], want[k]) for k in wrong[:3]}
    return (f"{name}: {len(got)} rows, oracle {len(want)}: {len(missing)} missing "
            f"{missing[:3]}, {len(extra)} extra {extra[:3]}, {len(wrong)} differ "
            f"(ours, oracle) {sample}")


def table_problems(table: str | Path, errors: str | Path, stream: KeyedStream,
                   upto: Mapping[int, int] | None = None) -> list[str]:
    """Everything wrong with ``table`` and ``errors`` against the oracle (empty: all good).

    ``upto`` None: the job has read everything sent, so the table equals the oracle and the
    error table holds exactly the malformed records. ``upto`` = the offsets the table recorded
    (a job killed mid-way): the table equals the oracle of those offsets; the error table holds
    the malformed records below them, and may hold more of the batch being written when the
    job died (it is written first), but only malformed records, each once.
    """
    problems: list[str] = []
    want = stream.oracle(upto)
    ours, duplicates = read_rows(table)
    if duplicates:
        problems.append(f"keys stored more than once: {duplicates[:5]}")
    problems.append(_diff("tidelake reader", ours, want) or "")
    theirs, count = hudi_rs_trips(table)
    if count != len(theirs):
        problems.append(f"hudi-rs returned {count} rows for {len(theirs)} keys")
    problems.append(_diff("hudi-rs", theirs, want) or "")
    if not Path(errors).exists():
        rows: list[dict[str, Any]] = []
    else:
        rows = Table.open(str(errors)).read().to_pylist()
    by_id = Counter(r["error_id"] for r in rows)
    if any(c > 1 for c in by_id.values()):
        problems.append(f"error ids stored twice: {[k for k, c in by_id.items() if c > 1][:5]}")
    bad = {f"{stream.topic}-{s.partition}-{s.offset}": s for s in stream.malformed()}
    for r in rows:
        s = bad.get(r["error_id"])
        if s is None:
            problems.append(f"error row {r['error_id']} is not a malformed record")
        elif (r["kafka_key"], r["value"], r["partition"], r["offset"]) != (
                s.key, s.value, s.partition, s.offset):
            problems.append(f"error row {r['error_id']} does not hold the record's bytes")
        elif not (r["reason"] or "").startswith(expected_reason(s.value)):
            problems.append(f"error row {r['error_id']}: reason {r['reason']!r}, expected "
                            f"{expected_reason(s.value)!r}")
    needed = {f"{stream.topic}-{s.partition}-{s.offset}" for s in stream.malformed(upto)}
    if needed - set(by_id):
        problems.append(f"{len(needed - set(by_id))} malformed records missing from the error "
                        f"table, e.g. {sorted(needed - set(by_id))[:3]}")
    if upto is None and set(by_id) != needed:
        problems.append(f"error table holds {len(by_id)} records, {len(needed)} malformed")
    return [p for p in problems if p]


# --- job settings ---------------------------------------------------------------------------


def job_settings(work: Path, bootstrap: str, topic: str, *, table_type: str = "MERGE_ON_READ",
                 index: str = "BUCKET", batch: int = 20_000) -> dict[str, Any]:
    """Settings (``section.key`` → value) of a job writing ``work/trips``, all available now."""
    return {
        "source.bootstrap_servers": bootstrap,
        "source.topics": [topic],
        "source.max_offsets_per_trigger": batch,
        "decode.schema": SCHEMA_DDL,
        "table.path": str(work / "trips"),
        "table.name": "trips",
        "table.type": table_type,
        "table.record_key": "trip_id",
        "table.precombine": "ts",
        "table.partition_by": "city",
        "index.type": index,
        "index.num_buckets": 2,
        "trigger.available_now": True,
        "checkpoint.location": str(work / "checkpoint"),
        "errors.table_path": str(work / "trips_errors"),
        "spark.conf.spark.sql.shuffle.partitions": "2",
    }


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # JSON string escapes are valid TOML basic-string escapes


def write_job(path: Path, settings: Mapping[str, Any]) -> Path:
    """Write ``settings`` as a TOML job file; ``spark.conf.*`` keys go to ``[spark.conf]``."""
    sections: dict[str, dict[str, Any]] = {}
    for name, value in settings.items():
        if name.startswith("spark.conf."):
            sections.setdefault("spark.conf", {})[json.dumps(name[len("spark.conf."):])] = value
        else:
            section, key = name.split(".", 1)
            sections.setdefault(section, {})[key] = value
    lines = []
    for section, body in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml(value)}" for key, value in body.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the job as a child process -------------------------------------------------------------


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a child job: the repo importable, Spark's Python workers on this Python."""
    env = dict(os.environ)
    paths = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update({"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                "SPARK_LOCAL_IP": "127.0.0.1", **(extra or {})})
    return env


def descendants(pid: int) -> list[int]:
    """Pids of every live process below ``pid`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


class ChildJob:
    """``python -m tests.ingest.job_child`` in its own session, output to ``<name>.log``.

    ``arm``: the file naming the crash point to stop at (see :mod:`tests.ingest.job_child`);
    ``stop``: the file whose appearance ends the job cleanly; ``ahead``: start the JVM and the
    Spark session only, and the rest (the broker check, the table, the sink, the query) at
    :meth:`go` — a restart started while the job it follows waits at its crash point.
    """

    def __init__(self, job_file: Path, work: Path, name: str, *, arm: Path | None = None,
                 stop: Path | None = None, env: Mapping[str, str] | None = None,
                 ahead: bool = False) -> None:
        self.log = work / f"{name}.log"
        self.report_path = work / f"{name}.report.json"
        self.signal = work / f"{name}.signal"
        self.go_file = work / f"{name}.go"
        args = [sys.executable, "-m", "tests.ingest.job_child", str(job_file),
                "--report", str(self.report_path)]
        if ahead:
            self.go_file.unlink(missing_ok=True)
            args += ["--go", str(self.go_file)]
        extra = dict(env or {})
        if arm is not None:
            args += ["--arm", str(arm), "--signal", str(self.signal)]
            # Spark's Python workers wrap their decoders for the "decode" crash point.
            extra.update({"TIDELAKE_TEST_CRASH_ARM": str(arm),
                          "TIDELAKE_TEST_CRASH_SIGNAL": str(self.signal)})
        if stop is not None:
            args += ["--stop", str(stop)]
        environment = child_env(extra)
        if arm is not None:
            environment["PYTHONPATH"] = os.pathsep.join(
                [environment["PYTHONPATH"], str(REPO / "tests" / "ingest" / "crash_site")])
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, env=environment, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def go(self) -> None:
        """Let a job started ``ahead`` go on past its session (see the class)."""
        self.go_file.touch()

    def report(self) -> dict[str, Any]:
        """The child's report so far (empty before it wrote one)."""
        try:
            return dict(json.loads(self.report_path.read_text()))
        except (OSError, ValueError):
            return {}

    def batches(self) -> list[dict[str, Any]]:
        """Micro-batches the child finished so far."""
        return list(self.report().get("batches", []))

    def tail(self, lines: int = 40) -> str:
        """The end of the child's output (for failure messages)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_for(self, condition: Any, timeout: float, what: str) -> None:
        """Wait until ``condition()`` holds; fail naming ``what`` if the child ends first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended (exit {self.proc.returncode}) before "
                                     f"{what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {what} within {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.2)

    def wait_signal(self, timeout: float = 900.0) -> dict[str, Any]:
        """Wait until the child stops at its crash point; returns what it wrote there."""
        self.wait_for(self.signal.exists, timeout, "crash point reached")
        return dict(json.loads(self.signal.read_text()))

    def wait(self, timeout: float = 900.0) -> int:
        """Wait for the child to end by itself; returns its exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not end within {timeout:.0f}s:\n"
                                 f"{self.tail()}") from None

    def kill(self) -> None:
        """SIGKILL the child and every process below it (JVM, Python workers) at once."""
        if self.proc.poll() is not None:  # ended and reaped: its pid may belong to another
            self.signal.unlink(missing_ok=True)
            return
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        groups = {self.proc.pid}  # its own session; Spark's Python daemon makes one more group
        for pid in pids:
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(pid))
        groups.discard(os.getpgrp())  # never this test process's own group
        for group in groups:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(60)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.signal.unlink(missing_ok=True)  # releases any waiter that somehow survived
