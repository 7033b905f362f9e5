"""Which version a replay leaves: ties, a later record of the same batch, a job committing
while the replay runs, and two replays at once (``ingest/replay.py``, issue 34 item 6).

Each micro-batch is played by ``replay_harness.route`` in the sink's order (the data instant
begins, the error table commits, the data instant completes), with the job's own prepare
step and error rows; the replay is the public :func:`ingest.replay.replay_errors` with the
sink of the fixed settings. A concurrent job commit is a real second writer (its own write
client and table lock) committing from another thread while the replay waits between its
judgement of what is late and its commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import ingest.replay as replay_module
from engine import Table
from engine.errors import TidelakeError
from ingest.error_table import ERROR_SCHEMA
from ingest.replay import is_replayed, replay_errors
from tests.helpers import hudi_rs_read, rows_by_key
from tests.ingest.replay_harness import COLUMNS, WRONG, fixed_sink, route, table_rows
from tests.kafka_broker import kafka_bootstrap  # noqa: F401
from tests.spark_session import spark  # noqa: F401

COMMIT_TIME = {"precombine": None}
"""A table without an ordering field: the later arrival wins (OCC by default)."""
EVENT_TIME: dict[str, Any] = {}
"""``ts`` orders versions; MERGE_ON_READ with the BUCKET index: non-blocking by default."""


def trip(k: str, ts: int, rider: str | None = None, **more: Any) -> dict[str, Any]:
    """A trip event; without ``rider`` it fails under ``WRONG`` (rider NOT NULL)."""
    record: dict[str, Any] = {"trip_id": k, "ts": ts, "city": "oslo", "fare": float(ts), **more}
    if rider is not None:
        record["rider"] = rider
    return record


def error_reasons(work: Path) -> dict[str, str]:
    """The error table's reasons by error id."""
    rows = Table.open(str(work / "trips_errors")).read().to_pylist()
    return {r["error_id"]: r["reason"] for r in rows}


def data_commits(work: Path) -> list[str]:
    """The table's completed commits (rollbacks left out)."""
    return [e.instant_time for e in Table.open(str(work / "trips")).timeline()
            if e.state == "completed" and e.action != "rollback"]


# --- (b) a later record of the same key in the record's own micro-batch ---------------------


def test_replay_commit_time_record_superseded_in_its_batch_leaves_later_version(
        tmp_path: Path) -> None:
    """Commit time, one micro-batch: a riderless ``a`` then a good ``a`` (the later one is
    stored), a riderless ``b`` then a delete of ``b`` (nothing stored), a good ``c`` then a
    riderless ``c`` (the bad one is the later). Replayed: ``a`` keeps its later version,
    ``b`` stays deleted, ``c`` takes the replayed one; the error rows say why."""
    route(tmp_path, WRONG, [trip("a", 1), trip("a", 2, "r"),
                            trip("b", 1), trip("b", 2, "r", _hoodie_is_deleted=True),
                            trip("c", 1, "r"), trip("c", 2)], 0, **COMMIT_TIME)
    stored = {"a": ("a", 2, "r", "oslo", 2.0), "c": ("c", 1, "r", "oslo", 1.0)}
    assert table_rows(tmp_path / "trips") == stored
    result = replay_errors(fixed_sink(tmp_path, **COMMIT_TIME))
    assert (result.replayed, result.late) == (3, 2)
    want = {"a": ("a", 2, "r", "oslo", 2.0), "c": ("c", 2, None, "oslo", 2.0)}
    assert table_rows(tmp_path / "trips") == want
    assert rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS) == want
    reasons = error_reasons(tmp_path)
    assert all(is_replayed(r) for r in reasons.values())
    assert "later record of its micro-batch" in reasons["t-0-0"]  # a
    assert "later record of its micro-batch" in reasons["t-0-2"]  # b
    assert " at " in reasons["t-0-5"].split(";")[0]  # c: written


def test_prepare_records_superseded_key_from_value_or_kafka_key_only_for_later_writes(
        tmp_path: Path) -> None:
    """The prepare step's ``superseded_key`` on error rows (``ingest/supersede.py``): a
    malformed value keyed ``a`` followed by a good ``a`` names ``a``; a bad one without a
    Kafka key names nothing; a value whose partition cannot be stored names its own key
    ``p`` (not its Kafka key ``zzz``); a bad ``q`` after the good ``q`` names nothing, and
    so does a bad ``b`` in Kafka partition 1 after a good ``b`` at a higher offset of
    partition 0 (the sink's arrival order: topic, partition, offset); rows given out of
    order are judged in that order."""
    import json

    from ingest.prepare import prepare_batch
    from ingest.rows import OFFSET, SUPERSEDED
    from tests.ingest.helpers import KAFKA

    sink = fixed_sink(tmp_path, **COMMIT_TIME)
    good = [trip(k, 1, "r") for k in "axpqb"]
    records = [  # (Kafka key, value, Kafka partition, offset)
        (b"a", b"{", 0, 1), (b"a", good[0], 0, 2),
        (None, b"{", 0, 3), (b"x", good[1], 0, 4),
        (b"zzz", trip("p", 1, "r", city="c" * 300), 0, 6), (b"p", good[2], 0, 7),
        (b"q", good[3], 0, 8), (b"q", b"{", 0, 9),
        (b"b", b"{", 1, 0), (b"b", good[4], 0, 5),
    ]
    records = records[1::2] + records[::2]  # not in arrival order
    kafka = pa.table({
        "key": [k for k, _, _, _ in records],
        "value": [v if isinstance(v, bytes) else json.dumps(v).encode() for _, v, _, _ in records],
        "topic": ["t"] * len(records), "partition": [p for _, _, p, _ in records],
        "offset": [o for _, _, _, o in records],
        "timestamp": [1_700_000_000_000_000] * len(records)}, schema=KAFKA)
    prepared = prepare_batch(kafka, sink.spec)
    got = {(p, o): k for p, o, k in zip(prepared.column("_tl_kafka_partition").to_pylist(),
                                         prepared.column(OFFSET).to_pylist(),
                                         prepared.column(SUPERSEDED).to_pylist(), strict=True)}
    assert {at: k for at, k in got.items() if k is not None} == {(0, 1): "a", (0, 6): "p"}


def test_prepare_superseded_key_from_a_json_kafka_key(tmp_path: Path) -> None:
    """``decode.key_format = json``: a malformed value whose Kafka key holds the record key
    field names that key when a good record of it follows; a Kafka key that is not JSON, or
    lacks the key field, names nothing."""
    import json

    from ingest.prepare import prepare_batch
    from ingest.rows import SUPERSEDED
    from tests.ingest.helpers import KAFKA

    sink = fixed_sink(tmp_path, key_format="json", **COMMIT_TIME)
    good = [json.dumps(trip(k, 1, "r")).encode() for k in "abc"]
    keys = [b'{"trip_id": "a"}', b'{"trip_id": "a"}', b"b", b"b", b'{"id": "c"}', b"c"]
    values = [b"{", good[0], b"{", good[1], b"{", good[2]]
    kafka = pa.table({"key": keys, "value": values, "topic": ["t"] * 6, "partition": [0] * 6,
                      "offset": list(range(6)), "timestamp": [1_700_000_000_000_000] * 6},
                     schema=KAFKA)
    assert prepare_batch(kafka, sink.spec).column(SUPERSEDED).to_pylist() == [
        "a", None, None, None, None, None]


def test_replay_error_table_without_superseded_column_still_replays(tmp_path: Path) -> None:
    """An error table written before ``superseded_key`` existed (its schema lacks it)
    replays: its rows read null there and are judged as before (a stored version of the
    record's own batch counts as earlier), and the marking commit adds the column."""
    route(tmp_path, WRONG, [trip("a", 1), trip("b", 1, "r")], 0, **COMMIT_TIME)
    old = Table.open(str(tmp_path / "trips_errors"))
    rows = old.read(columns=[f.name for f in ERROR_SCHEMA if f.name != "superseded_key"])
    errors = tmp_path / "old_errors"
    old_schema = pa.schema([f for f in ERROR_SCHEMA if f.name != "superseded_key"])
    Table.create(str(errors), name="trips_errors", table_type="COPY_ON_WRITE",
                 record_key="error_id", partition_by=["error_date"], schema=old_schema,
                 options={"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": "2"}
                 ).upsert(rows.select(old_schema.names).cast(old_schema))
    assert "superseded_key" not in Table.open(str(errors)).read().column_names
    sink = fixed_sink(tmp_path, **COMMIT_TIME, table_options={})
    sink.error_table = Table.open(str(errors))
    result = replay_errors(sink)
    assert (result.replayed, result.late) == (1, 0)
    assert table_rows(tmp_path / "trips")["a"] == ("a", 1, None, "oslo", 1.0)
    marked = Table.open(str(errors)).read()
    assert marked.column("superseded_key").to_pylist() == [None]
    assert is_replayed(marked.column("reason")[0].as_py())


# --- (a) event time: a tie of ordering values goes to the later arrival ---------------------


def test_replay_event_time_tie_goes_to_the_later_arrival(tmp_path: Path) -> None:
    """Event time, ``ts`` ties everywhere: ``a`` failed in batch 1 and a good ``a`` came in
    batch 2 (stored later: it stays); ``b`` failed before a good ``b`` of its own batch (it
    stays); a good ``c`` came before a failed ``c`` of its batch, and a good ``d`` in batch 1
    before a failed ``d`` in batch 2 (the replayed ones arrived later: they win)."""
    route(tmp_path, WRONG, [trip("a", 5), trip("b", 5), trip("b", 5, "later"),
                            trip("c", 5, "early"), trip("c", 5), trip("d", 5, "early")], 0,
          **EVENT_TIME)
    route(tmp_path, WRONG, [trip("a", 5, "later"), trip("d", 5)], 6, **EVENT_TIME)
    result = replay_errors(fixed_sink(tmp_path, **EVENT_TIME))
    assert (result.replayed, result.late) == (4, 2)
    want = {"a": ("a", 5, "later", "oslo", 5.0), "b": ("b", 5, "later", "oslo", 5.0),
            "c": ("c", 5, None, "oslo", 5.0), "d": ("d", 5, None, "oslo", 5.0)}
    assert table_rows(tmp_path / "trips") == want
    assert rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS) == want


def test_replay_float_ordering_ties_and_wins_in_javas_order(tmp_path: Path) -> None:
    """Event time on a double (``fare``): ordering values tie and win as Java's
    ``Double.compareTo`` has them (Hudi's merge rule). ``a`` failed at 0.0 and a good ``a``
    came later at -0.0: -0.0 is lower, so the replayed ``a`` wins though it arrived first;
    ``n`` failed at NaN and a good ``n`` came later at NaN: every NaN ties, so the later
    arrival (the stored one) stays. Before, the replay judged ties by Python's ``==``
    (-0.0 == 0.0, NaN != NaN) and left the opposite rows."""
    by_fare = {"precombine": "fare"}
    nan = float("nan")
    route(tmp_path, WRONG, [trip("a", 1, fare=0.0), trip("n", 1, fare=nan)], 0, **by_fare)
    route(tmp_path, WRONG, [trip("a", 2, "later", fare=-0.0),
                            trip("n", 2, "later", fare=nan)], 6, **by_fare)
    result = replay_errors(fixed_sink(tmp_path, **by_fare))
    assert (result.replayed, result.late) == (2, 1)
    rows = table_rows(tmp_path / "trips")
    assert rows["a"][:3] == ("a", 1, None) and str(rows["a"][4]) == "0.0"
    assert rows["n"][:3] == ("n", 2, "later")
    seen = rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS)
    assert (seen["a"][:3], seen["n"][:3]) == (("a", 1, None), ("n", 2, "later"))


# --- (c) a job commit between the replay's judgement and its commit -------------------------


def pause_after_judgement(monkeypatch: pytest.MonkeyPatch, between: Callable[[], None]) -> None:
    """Run ``between`` once, right after the replay's first judgement of what is late."""
    original = replay_module._drop_late
    fired: list[bool] = []

    def judged(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if not fired:
            fired.append(True)
            between()
        return out

    monkeypatch.setattr(replay_module, "_drop_late", judged)


def race(monkeypatch: pytest.MonkeyPatch, replay: Callable[[], Any],
         job: Callable[[], None]) -> Any:
    """Run ``replay`` in a thread; when it has judged, ``job`` commits from this thread while
    the replay waits; then the replay goes on. Its result (or its exception, raised)."""
    judged, committed = threading.Event(), threading.Event()

    def between() -> None:
        judged.set()
        assert committed.wait(120), "the job's commit never came"

    pause_after_judgement(monkeypatch, between)
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(replay())
        except BaseException as exc:  # handed to the test thread
            out.append(exc)
            judged.set()

    thread = threading.Thread(target=run, name="replay")
    thread.start()
    try:
        assert judged.wait(120), "the replay never judged"
        if not out:
            job()
    finally:
        committed.set()
        thread.join(300)
    assert out, "the replay did not end"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


@pytest.mark.parametrize("options", [COMMIT_TIME, EVENT_TIME], ids=["occ-commit-time",
                                                                    "nbcc-event-time"])
def test_replay_job_commit_between_judgement_and_commit_is_not_overwritten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]) -> None:
    """A riderless ``a`` is in the error table; while the replay runs — after it judged
    ``a`` not late, before its commit — the job commits a later ``a`` (same ``ts``: a tie
    under event time). The replay must not overwrite it: its commit is refused, and it runs
    again and finds ``a`` late. On the commit-time table optimistic concurrency refuses it;
    on the event-time MERGE_ON_READ bucket table (non-blocking, log writers never conflict)
    the replay's own check under the table lock does."""
    route(tmp_path, WRONG, [trip("a", 5), trip("z", 5, "r")], 0, **options)
    result = race(monkeypatch, lambda: replay_errors(fixed_sink(tmp_path, **options)),
                  lambda: route(tmp_path, WRONG, [trip("a", 5, "job")], 2, **options))
    assert (result.replayed, result.late, result.instant_time) == (1, 1, None)
    want = {"a": ("a", 5, "job", "oslo", 5.0), "z": ("z", 5, "r", "oslo", 5.0)}
    assert table_rows(tmp_path / "trips") == want
    assert rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS) == want


def test_replay_refused_by_a_job_commit_every_time_fails_naming_the_conflict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job commits to the replay's file group after each of its judgements: the replay
    gives up after its three runs with a WriteConflictError saying so; nothing of it is
    committed, its rows stay unmarked, and a replay once the job is idle writes them."""
    from engine.errors import WriteConflictError
    from ingest.replay import REPLAY_ATTEMPTS

    route(tmp_path, WRONG, [trip("a", 5), trip("b", 5), trip("c", 5, "r")], 0, **COMMIT_TIME)
    before = data_commits(tmp_path)
    offset = [3]
    original = replay_module._drop_late

    def busy_job(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        route(tmp_path, WRONG, [trip("z", offset[0], "job")], offset[0], **COMMIT_TIME)
        offset[0] += 1
        return out

    monkeypatch.setattr(replay_module, "_drop_late", busy_job)
    with pytest.raises(WriteConflictError, match=f"refused by a concurrent commit "
                                                 f"{REPLAY_ATTEMPTS} times"):
        replay_errors(fixed_sink(tmp_path, **COMMIT_TIME))
    assert len(data_commits(tmp_path)) == len(before) + REPLAY_ATTEMPTS  # the job's only
    assert not any(is_replayed(r) for r in error_reasons(tmp_path).values())
    monkeypatch.undo()
    result = replay_errors(fixed_sink(tmp_path, **COMMIT_TIME))
    assert (result.replayed, result.late) == (2, 0)
    assert set(table_rows(tmp_path / "trips")) == {"a", "b", "c", "z"}


@pytest.mark.parametrize("options", [COMMIT_TIME, EVENT_TIME], ids=["occ-commit-time",
                                                                    "nbcc-event-time"])
def test_replay_while_its_own_batch_commits_leaves_its_rows_for_later(
        tmp_path: Path, options: dict[str, Any]) -> None:
    """A replay between a micro-batch's error-table commit and its data commit (the sink's
    order) must not replay that batch's rows: a good ``a`` (rider ``early``) came before a
    riderless ``a`` (same ``ts``) in the batch, and the replayed one would be written before
    the batch's own, which then wins (retried after the conflict, or completing later). The
    rows are left for a later replay, which takes the later ``a``."""
    first: list[Any] = []
    route(tmp_path, WRONG, [trip("a", 5, "early"), trip("a", 5)], 0,
          before_data_commit=lambda: first.append(replay_errors(fixed_sink(tmp_path,
                                                                           **options))),
          **options)
    assert (first[0].replayed, first[0].instant_time) == (0, None)
    assert table_rows(tmp_path / "trips") == {"a": ("a", 5, "early", "oslo", 5.0)}
    assert not any(is_replayed(r) for r in error_reasons(tmp_path).values())
    second = replay_errors(fixed_sink(tmp_path, **options))
    assert (second.replayed, second.late) == (1, 0)
    want = {"a": ("a", 5, None, "oslo", 5.0)}
    assert table_rows(tmp_path / "trips") == want
    assert rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS) == want


def test_replay_second_replay_while_one_runs_is_refused_naming_the_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two replays of one error table at once: the second is refused at once (a
    TidelakeError naming the running one), writes nothing; the first then completes."""
    route(tmp_path, WRONG, [trip("a", 1), trip("b", 1)], 0)
    refused: list[BaseException] = []

    def second() -> None:
        try:
            replay_errors(fixed_sink(tmp_path))
        except TidelakeError as exc:
            refused.append(exc)

    first = race(monkeypatch, lambda: replay_errors(fixed_sink(tmp_path)), second)
    assert refused, "the second replay ran beside the first"
    assert type(refused[0]).__name__ == "ReplayRunningError"
    assert "another replay of" in str(refused[0]) and "pid" in str(refused[0])
    assert (first.replayed, first.late) == (2, 0)
    assert set(table_rows(tmp_path / "trips")) == {"a", "b"}
    again = replay_errors(fixed_sink(tmp_path))  # the marker is gone with the first
    assert again.already_replayed == 2


def test_replay_stale_marker_of_a_dead_replay_is_taken_over(tmp_path: Path) -> None:
    """A marker a replay on another machine left and stopped renewing is broken once it
    is older than the expiry; a fresh one of a live replay is not."""
    import json
    import os
    import time

    from ingest.replay_guard import MARKER_EXPIRY_SECONDS, MARKER_FOLDER, ReplayRunningError

    route(tmp_path, WRONG, [trip("a", 1)], 0)
    marker = tmp_path / "trips_errors" / MARKER_FOLDER / ".hoodie" / "lock"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"owner": "x", "host": "elsewhere", "pid": 1,
                                  "acquired_at_ms": 0}))
    with pytest.raises(ReplayRunningError, match="elsewhere pid 1"):
        replay_errors(fixed_sink(tmp_path))
    old = time.time() - MARKER_EXPIRY_SECONDS - 5
    os.utime(marker, (old, old))
    assert replay_errors(fixed_sink(tmp_path)).replayed == 1
    assert not marker.exists()


def test_replay_whose_marker_was_taken_over_commits_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that stalled until another took its marker over (here: the marker replaced
    between its judgement and its commit) stops before its commit point, naming the marker;
    nothing is committed to either table."""
    import json

    from ingest.replay_guard import MARKER_FOLDER, ReplayRunningError

    route(tmp_path, WRONG, [trip("a", 1), trip("b", 1, "r")], 0)
    before = data_commits(tmp_path)
    marker = tmp_path / "trips_errors" / MARKER_FOLDER / ".hoodie" / "lock"

    def taken_over() -> None:
        marker.unlink()
        marker.write_text(json.dumps({"owner": "another", "host": "elsewhere", "pid": 2}))

    pause_after_judgement(monkeypatch, taken_over)
    with pytest.raises(ReplayRunningError, match="taken over"):
        replay_errors(fixed_sink(tmp_path))
    assert data_commits(tmp_path) == before
    assert not any(is_replayed(r) for r in error_reasons(tmp_path).values())
    assert set(table_rows(tmp_path / "trips")) == {"b"}


# --- (b) through the real job: Spark, the embedded broker, an older error table ------------


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
@pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")
def test_replay_after_real_job_superseded_record_leaves_later_version(
        spark: Any, kafka_bootstrap: str, tmp_path: Path,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """The job (Spark, the embedded broker, one micro-batch) on a commit-time table whose
    error table predates ``superseded_key``: a riderless ``a`` before a good ``a``, a
    riderless ``b`` before a delete of ``b``, a good ``c`` before a riderless ``c``. The job
    adds the column to the old error table and fills it in its read tasks; the CLI's replay
    then leaves ``a`` and ``b`` as the job left them and takes the later ``c``."""
    from ingest.kafka_produce import create_topic, produce
    from jobs.cli import main
    from jobs.ingest_job import start, watch
    from jobs.job_config import load
    from tests.ingest.job_harness import write_job
    from tests.ingest.replay_harness import FIXED, key, settings, value
    from tests.kafka_broker import unique_topic

    old_schema = pa.schema([f for f in ERROR_SCHEMA if f.name != "superseded_key"])
    Table.create(str(tmp_path / "trips_errors"), name="trips_errors",
                 table_type="COPY_ON_WRITE", record_key="error_id",
                 partition_by=["error_date"], schema=old_schema,
                 options={"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": "2"})
    topic = unique_topic("replay-order")
    create_topic(kafka_bootstrap, topic, 1)
    sent = [trip("a", 1), trip("a", 2, "r"), trip("b", 1),
            trip("b", 2, "r", _hoodie_is_deleted=True), trip("c", 1, "r"), trip("c", 2)]
    produce(kafka_bootstrap, topic, [(key(r, i), value(r), 0) for i, r in enumerate(sent)])
    job = settings(tmp_path, WRONG, bootstrap=kafka_bootstrap, topic=topic, **COMMIT_TIME)
    _, sink, query = start(load(None, job), spark)
    watch(query, sink)
    errors = Table.open(str(tmp_path / "trips_errors")).read()
    assert dict(zip(errors.column("error_id").to_pylist(),
                    errors.column("superseded_key").to_pylist(), strict=True)) == {
        f"{topic}-0-0": "a", f"{topic}-0-2": "b", f"{topic}-0-5": None}
    assert table_rows(tmp_path / "trips") == {"a": ("a", 2, "r", "oslo", 2.0),
                                              "c": ("c", 1, "r", "oslo", 1.0)}

    fixed = write_job(tmp_path / "job.toml", settings(tmp_path, FIXED, bootstrap=kafka_bootstrap,
                                                      topic=topic, **COMMIT_TIME))
    assert main(["errors", "replay", str(fixed)]) == 0
    assert "2 of them late" in capsys.readouterr().out
    want = {"a": ("a", 2, "r", "oslo", 2.0), "c": ("c", 2, None, "oslo", 2.0)}
    assert table_rows(tmp_path / "trips") == want
    assert rows_by_key(hudi_rs_read(tmp_path / "trips"), "trip_id", COLUMNS) == want
