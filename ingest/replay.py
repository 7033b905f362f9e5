"""Replay the error table: decode its records again with the job's current settings, write
those that now decode into the table, exactly once, and mark them in the error table.

After a schema mistake or a producer bug is fixed in the job's settings, the records the job
routed to the error table (raw Kafka key and value, coordinates, reason;
:mod:`ingest.error_table`) can be replayed (``tidelake errors replay JOB.toml``). Driver
side, no Spark: the records are prepared by :func:`ingest.prepare.prepare_batch` with the
sink's own :class:`~ingest.prepare.PrepareSpec` (the decoder, keys, partitions, ordering
values of the job), in arrival order (topic, Kafka partition, offset); their versions are
resolved as the sink resolves a micro-batch (:func:`engine.merge.resolve.resolve` under the
sink's delete policy, :data:`ingest.resolve.POLICY`), and the winners are written by the
engine's write client in one instant, which tags, places and drops versions older than the
stored ones as every writer of the table does.

**Which version wins.** With an ordering field (event time) the engine's rule decides: a
replayed version wins unless its ordering value is below the stored one's. A record without
one to compare — any record of a table without an ordering field (commit-time ordering),
and a tombstone — and a record whose ordering value ties the stored one's (Hudi's merge,
``DefaultHoodieRecordPayload``, gives a tie to the later arrival) are judged by arrival:
*late* when its key's stored version was written by a commit newer than the one of the
record's own micro-batch (the first data commit whose Kafka checkpoint is past the record's
offset; for a micro-batch that wrote no data, the error-table commit that took the record),
or when its error row's ``superseded_key`` is its key — a later record of the key in its own
micro-batch was written (:mod:`ingest.supersede`). Either way that version arrived later
through Kafka, and the late record changes nothing. A stored version of the record's own
micro-batch without ``superseded_key`` (none was seen, or the row predates the column) is
taken as earlier. A delete that arrived while its key was not stored at all (its earlier
versions all in the error table) left nothing to compare with: replaying those versions
brings the key back.

**Beside the job.** A run begins its data instant *before* it judges what is late, and
judges against the table as of then; its commit is refused
(:class:`~engine.errors.WriteConflictError`) when a commit that completed since it began
wrote one of its file groups — the engine's optimistic check, and under non-blocking
concurrency the same check made here under the table lock right before the commit point
(log writers never conflict there). A refused run is rolled back and run again
(:data:`REPLAY_ATTEMPTS` in all). One replay of an error table runs at a time
(:mod:`ingest.replay_guard`).

**Exactly once.** Each run has an id. The data commit's extra metadata records it
(:data:`REPLAY_ID_KEY`) and the Kafka coordinates of every record it replayed
(:data:`REPLAY_RECORDS_KEY`, offsets as ranges per topic and partition); then one
error-table commit marks those rows (their ``reason`` becomes
``replayed into <table> at <instant>; was: <old reason>``, :data:`REPLAYED_PREFIX`) and gives
the records that still fail their new reason. A run first rolls back what a killed run left
pending in either table, then marks every row that a completed replay commit of the table
lists but the error table does not mark yet (the run was killed between its two commits):
such rows are never decoded or written again. Marked rows are skipped; a run that finds
nothing new writes no commit at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import InvalidOptionError, TableExistsError, WriteConflictError
from engine.merge.policy import ordering_ties
from engine.merge.resolve import field_ordering, ordering_column, resolve
from engine.schema import COMMIT_TIME, PARTITION_PATH, RECORD_KEY
from engine.table import Table
from engine.write.distributed import UPSERT as UPSERT_OPERATION
from engine.write.distributed import (
    Timeline,
    WriteClient,
    check_conflicts,
    data_commits,
    write_pending,
)
from ingest.checkpoint import STREAMER_CHECKPOINT_KEY
from ingest.error_table import ERROR_SCHEMA
from ingest.kafka_offsets import parse_hudi_checkpoint
from ingest.prepare import PrepareSpec, prepare_batch
from ingest.replay_guard import one_replay
from ingest.resolve import POLICY
from ingest.rows import (
    DELETE,
    ERROR,
    KAFKA_PARTITION,
    OFFSET,
    OP,
    ORDERING,
    ORDERING_NULL,
    REASON,
    TOPIC,
    UPSERT,
    VERSIONS,
)
from ingest.sink_config import GLOBAL_STATE

if TYPE_CHECKING:
    from ingest.sink import HudiStreamingSink

__all__ = ["REPLAYED_PREFIX", "REPLAY_ID_KEY", "REPLAY_RECORDS_KEY", "ReplayResult",
           "is_replayed", "replay_errors", "replayed_records"]

log = logging.getLogger(__name__)

REPLAY_ID_KEY = "tidelake.replay.id"
"""Extra metadata of a replay's commits (data and error table): the run's id."""
REPLAY_RECORDS_KEY = "tidelake.replay.records"
"""Extra metadata of a replay's data commit: the records it replayed, as JSON
``{topic: {partition: [[first offset, last offset], ...]}}``."""
REPLAY_ERROR_TABLE_KEY = "tidelake.replay.error_table"
"""Extra metadata of a replay's data commit: the error table it replayed from."""
REPLAYED_PREFIX = "replayed into "
"""How the ``reason`` of a replayed error row starts."""

Coordinates = tuple[str, int, int]
"""(topic, Kafka partition, offset) of a record."""


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`replay_errors` did (or, with ``dry_run``, would do)."""

    replay_id: str
    instant_time: str | None = None
    """The data table's commit of this run (None: nothing written there)."""
    error_instant_time: str | None = None
    """The error table's commit of this run (None: nothing changed there)."""
    replayed: int = 0
    """Records of this run that decode now, written (or, if older than the stored version,
    dropped as the sink drops them) and marked."""
    recovered: int = 0
    """Records an earlier run wrote but was killed before marking: marked now, not written."""
    late: int = 0
    """Of :attr:`replayed`: records left out because their key's stored version arrived
    later (no ordering value to compare)."""
    still_failing: int = 0
    """Records that still do not decode (or lack a key, ...), with their new reason."""
    reasons: Mapping[str, int] = field(default_factory=dict)
    """The new reasons of :attr:`still_failing`, counted."""
    already_replayed: int = 0
    """Rows an earlier replay marked (skipped)."""
    other_tables: int = 0
    """Rows of the error table that belong to another table (skipped)."""
    superseded: int = 0
    """Of :attr:`late`: records whose error row says a later record of the same key was
    written in their own micro-batch (``superseded_key``)."""
    deferred: int = 0
    """Records left for a later replay, untouched: their micro-batch may still be committing
    (no data commit records their offset yet while a data instant of the table is pending)."""


def is_replayed(reason: str | None) -> bool:
    """True for the ``reason`` of an error row a replay marked."""
    return bool(reason) and str(reason).startswith(REPLAYED_PREFIX)


def _marked(reason: str, table_name: str, instant: str | None, *,
            late: str | None = None) -> str:
    """The ``reason`` of a replayed row: the commit it went in (``late``: none, a later
    version is stored — ``SUPERSEDED_IN_BATCH``: a later record of its own micro-batch;
    ``instant`` None: the replay had nothing to write), and its old reason."""
    where = ("(late: superseded by a later record of its micro-batch)"
             if late == SUPERSEDED_IN_BATCH
             else "(late: a later version is stored)" if late
             else f"at {instant}" if instant else "(nothing to change)")
    return f"{REPLAYED_PREFIX}{table_name} {where}; was: {reason}"


def encode_records(coordinates: Iterable[Coordinates]) -> str:
    """Kafka coordinates as the JSON of :data:`REPLAY_RECORDS_KEY` (offset ranges)."""
    by_part: dict[str, dict[str, list[list[int]]]] = {}
    for topic, partition, offset in sorted(set(coordinates)):
        ranges = by_part.setdefault(topic, {}).setdefault(str(partition), [])
        if ranges and ranges[-1][1] + 1 == offset:
            ranges[-1][1] = offset
        else:
            ranges.append([offset, offset])
    return json.dumps(by_part, separators=(",", ":"), sort_keys=True)


def decode_records(text: str) -> set[Coordinates]:
    """The coordinates of :func:`encode_records`'s JSON."""
    out: set[Coordinates] = set()
    for topic, parts in json.loads(text).items():
        for partition, ranges in parts.items():
            for first, last in ranges:
                out.update((topic, int(partition), o) for o in range(int(first), int(last) + 1))
    return out


def replayed_records(table: Table) -> dict[Coordinates, str]:
    """Every record a completed replay commit of ``table`` wrote (archived commits
    included), and that commit's instant time."""
    timeline = Timeline.load(table.storage, table.config)
    found: dict[Coordinates, str] = {}
    for instant_time, metadata in data_commits(timeline):
        text = metadata().extra_metadata.get(REPLAY_RECORDS_KEY)
        if text:
            for record in decode_records(text):
                found[record] = instant_time
    return found


def _kafka_rows(rows: pa.Table) -> pa.Table:
    """Error-table rows as the Kafka rows they came from, in arrival order."""
    kafka = pa.table({
        "key": rows.column("kafka_key"), "value": rows.column("value"),
        "topic": rows.column("topic"), "partition": rows.column("partition"),
        "offset": rows.column("offset"), "timestamp": rows.column("kafka_timestamp"),
    })
    return kafka.sort_by([("topic", "ascending"), ("partition", "ascending"),
                          ("offset", "ascending")])


def _coordinates(rows: pa.Table, topic: str = "topic", partition: str = "partition",
                 offset: str = "offset") -> list[Coordinates]:
    return list(zip(rows.column(topic).to_pylist(), rows.column(partition).to_pylist(),
                    rows.column(offset).to_pylist(), strict=True))


def _arrivals(table: Table, coordinates: Iterable[Coordinates]) -> dict[Coordinates, str]:
    """For each record, the data commit that recorded its offset as read (the first whose
    Kafka checkpoint, ``streamer.checkpoint.key``, is past it): the commit of the micro-batch
    that took the record (its time is when that batch's data instant started). Records no
    commit covers (their micro-batch wrote nothing to the table) are left out. Archived
    commits are read too, oldest first."""
    wanted: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in coordinates:
        wanted.setdefault((topic, partition), []).append(offset)
    if not wanted or not table.exists:
        return {}
    for offsets in wanted.values():
        offsets.sort()
    found: dict[Coordinates, str] = {}
    for instant_time, metadata in data_commits(Timeline.load(table.storage, table.config)):
        text = metadata().extra_metadata.get(STREAMER_CHECKPOINT_KEY)
        if not text:
            continue
        try:
            recorded = parse_hudi_checkpoint(text)
        except ValueError:
            continue  # not ours to judge here; the job reports it
        for (topic, partition), offsets in wanted.items():
            end = recorded.get(topic, {}).get(partition)
            while offsets and end is not None and offsets[0] < end:
                found[(topic, partition, offsets.pop(0))] = instant_time
        if not any(wanted.values()):
            break
    return found


def _stored(table: Table, keys: list[str], ordering: str | None) -> pa.Table:
    """Key, partition, commit time (and ordering value) of the stored versions of ``keys``."""
    empty = pa.table({RECORD_KEY: pa.array([], pa.string()),
                      PARTITION_PATH: pa.array([], pa.string()),
                      COMMIT_TIME: pa.array([], pa.string())})
    if not keys or not table.exists:
        return empty
    columns = [RECORD_KEY, PARTITION_PATH, COMMIT_TIME] + ([ordering] if ordering else [])
    found = table.read(columns=columns, filters=[(RECORD_KEY, "in", sorted(set(keys)))])
    if not found.num_rows:
        return empty
    return found.set_column(found.schema.get_field_index(COMMIT_TIME), COMMIT_TIME,
                            found.column(COMMIT_TIME).cast(pa.string()))


Late = dict[Coordinates, str]
"""Late records of a replay and why (:data:`STORED_LATER`, :data:`SUPERSEDED_IN_BATCH`)."""
STORED_LATER = "stored later"
"""Late: its key's stored version was committed after the record's micro-batch."""
SUPERSEDED_IN_BATCH = "superseded in its batch"
"""Late: a later record of the same key in its own micro-batch was written (its error row's
``superseded_key``, :mod:`ingest.supersede`)."""


REPLAY_ATTEMPTS = 3
"""Runs of a replay that a concurrent commit refused (:class:`WriteConflictError`) before it
gives up, naming the conflict."""


def replay_errors(sink: HudiStreamingSink, *, dry_run: bool = False) -> ReplayResult:
    """Replay the error table of ``sink`` (built from the job's current settings) into its
    table; see the module doc. ``dry_run``: decode and report, write nothing. Driver side,
    no Spark session needed.

    The GLOBAL_STATE index is refused (:class:`~engine.errors.InvalidOptionError` naming
    ``index.type``): it keeps every key's location in the job's state, which a replay from
    outside the job cannot update. Another replay of the same error table running raises
    :class:`~ingest.replay_guard.ReplayRunningError`; a run refused by a concurrent commit
    (:class:`~engine.errors.WriteConflictError`) is run again, :data:`REPLAY_ATTEMPTS` times
    in all.
    """
    if sink.index == GLOBAL_STATE:
        raise InvalidOptionError(
            "index.type", "GLOBAL_STATE keeps every key's location in the job's own state, "
            "which a replay from outside the job cannot update (a replayed key would be "
            "unknown to it); replay works with the BUCKET and RECORD_INDEX indexes")
    errors = sink.error_table
    if errors is None:
        raise InvalidOptionError("errors.table_path", "the job has no error table to replay")
    if dry_run:
        return _replay(sink, errors, None)
    with one_replay(errors) as still_held:
        for attempt in range(1, REPLAY_ATTEMPTS + 1):
            try:
                return _replay(sink, errors, still_held)
            except WriteConflictError as exc:
                if attempt == REPLAY_ATTEMPTS:
                    raise WriteConflictError(
                        f"replay of {errors.path} into {sink.table.path}: refused by a "
                        f"concurrent commit {REPLAY_ATTEMPTS} times (the job writes the "
                        "same file groups meanwhile); what the replay committed stays, the "
                        "rest was rolled back: run it again, or while the job is idle. "
                        f"Last: {exc}") from exc
                log.warning("replay of %s: refused by a concurrent commit (%s); running it "
                            "again (%d of %d)", errors.path, exc, attempt + 1, REPLAY_ATTEMPTS)
    raise AssertionError("unreachable")  # pragma: no cover


def _replay(sink: HudiStreamingSink, errors: Table,
            still_held: Callable[[], None] | None) -> ReplayResult:
    """One run of :func:`replay_errors`; ``still_held`` (None: a dry run) raises if the
    replay marker is no longer this run's, checked right before each commit."""
    dry_run = still_held is None
    table, name = sink.table, sink.table.config.name
    replay_id = uuid.uuid4().hex
    if not dry_run:
        for t in (table, errors):
            if t.exists:
                rolled = t.rollback_failed_writes()
                if rolled:
                    log.info("rolled back %d pending instant(s) of %s: %s", len(rolled),
                             t.path, ", ".join(rolled))
    rows = errors.read()
    if not rows.num_rows:
        return ReplayResult(replay_id)
    ours = pc.fill_null(pc.equal(rows.column("target_table"), name), False)
    other_tables = rows.num_rows - pc.sum(ours.cast(pa.int64())).as_py()
    rows = rows.filter(ours)
    done = np.array([is_replayed(r) for r in rows.column("reason").to_pylist()], dtype=bool)
    already = int(done.sum())
    rows = rows.filter(pa.array(~done))

    # Rows a completed replay commit wrote but whose marking was lost: mark, never rewrite.
    written = replayed_records(table) if table.exists else {}
    instants = [written.get(c) for c in _coordinates(rows)]
    recovered_mask = np.array([i is not None for i in instants], dtype=bool)
    updates: list[dict[str, Any]] = []
    for row, instant in zip(rows.filter(pa.array(recovered_mask)).to_pylist(),
                            [i for i in instants if i is not None], strict=True):
        updates.append({**row, "reason": _marked(row["reason"], name, instant)})
    pending = rows.filter(pa.array(~recovered_mask))
    deferred_mask = _in_flight(table, pending)
    pending = pending.filter(pa.array(~deferred_mask))

    spec = dataclasses.replace(sink.spec, pack=False, state_shards=None,
                               num_buckets=None, ring_table=None)
    kafka = _kafka_rows(pending)
    prepared = prepare_batch(kafka, spec) if kafka.num_rows else None
    by_coordinates = {c: row for c, row in zip(_coordinates(pending), pending.to_pylist(),
                                               strict=True)}
    reasons: Counter[str] = Counter()
    still = 0
    writable = None
    if prepared is not None:
        ops = prepared.column(OP).to_numpy()
        bad = prepared.filter(pa.array(ops == ERROR))
        for coords, reason in zip(_coordinates(bad, TOPIC, KAFKA_PARTITION, OFFSET),
                                  bad.column(REASON).to_pylist(), strict=True):
            still += 1
            reasons[reason] += 1
            row = by_coordinates[coords]
            if row["reason"] != reason:
                updates.append({**row, "reason": reason})
        writable = prepared.filter(pa.array((ops == UPSERT) | (ops == DELETE)))
    replayed_coords = (_coordinates(writable, TOPIC, KAFKA_PARTITION, OFFSET)
                       if writable is not None else [])
    late: Late = {}
    instant_time = None
    if writable is not None and writable.num_rows:
        if dry_run:
            _, late = _drop_late(table, writable, by_coordinates, spec)
        else:
            assert still_held is not None
            instant_time, late = _write(sink, writable, by_coordinates, replay_id,
                                        replayed_coords, errors.path, still_held)
        for coords in replayed_coords:
            row = by_coordinates[coords]
            updates.append({**row, "reason": _marked(row["reason"], name, instant_time,
                                                     late=late.get(coords))})
    error_instant = None
    if updates and still_held is not None:
        still_held()
        error_instant = _mark(errors, updates, replay_id)
    result = ReplayResult(replay_id, instant_time, error_instant, len(replayed_coords),
                          int(recovered_mask.sum()), len(late), still, dict(reasons), already,
                          other_tables, sum(why == SUPERSEDED_IN_BATCH for why in late.values()),
                          int(deferred_mask.sum()))
    log.info("replay %s of %s into %s: %s", replay_id, errors.path, table.path, result)
    return result


def _in_flight(table: Table, rows: pa.Table) -> np.ndarray:
    """Per error row: whether its micro-batch may still be committing. The sink commits a
    batch's error rows before its data instant completes, so a row that no data commit's
    Kafka checkpoint covers yet belongs to a batch in flight (or retried after a failure)
    while a data instant of the table is pending; replayed now, its version would be
    followed by its own batch's earlier ones. Such rows wait for a later replay. (A batch of
    bad records only never completes its data instant: its rows are covered by the next
    batch's commit, or replayed at once when no data instant is pending.)"""
    none = np.zeros(rows.num_rows, dtype=bool)
    if not rows.num_rows or not table.exists:
        return none
    timeline = Timeline.load(table.storage, table.config)
    if not write_pending(timeline):
        return none
    coordinates = _coordinates(rows)
    covered = _arrivals(table, coordinates)
    return np.array([c not in covered for c in coordinates], dtype=bool)


def _drop_late(table: Table, rows: pa.Table, by_coordinates: Mapping[Coordinates, Any],
               spec: PrepareSpec) -> tuple[pa.Table, Late]:
    """``rows`` less the late ones, and why each is late (see the module doc): a record
    whose error row says a later record of its key was written in its micro-batch, and
    the records without an ordering value to compare (every row without event time,
    tombstones with it) whose key's stored version was committed after the record's
    micro-batch (:func:`_arrivals`); with event time, a record whose ordering value ties
    the stored version's (:func:`engine.merge.policy.ordering_ties`: Java's order, -0.0
    below 0.0, NaN tying NaN) is judged the same way (Hudi gives a tie to the later
    arrival)."""
    event_time = spec.event_time
    ops = rows.column(OP).to_numpy()
    if event_time:
        unordered = (ops == DELETE) & rows.column(ORDERING_NULL).to_numpy(zero_copy_only=False)
    else:
        unordered = np.ones(rows.num_rows, dtype=bool)
    keys = rows.column(RECORD_KEY).to_pylist()
    parts = rows.column(PARTITION_PATH).to_pylist()
    coordinates = _coordinates(rows, TOPIC, KAFKA_PARTITION, OFFSET)
    superseded = np.array([by_coordinates[c].get("superseded_key") == k
                           for c, k in zip(coordinates, keys, strict=True)], dtype=bool)
    ordering = table.config.precombine_field if event_time else None
    stored = _stored(table, keys, ordering)
    newest: dict[str, str] = {}
    held: dict[tuple[str, str | None], tuple[str, Any]] = {}  # (key, partition | None)
    values = (ordering_column(stored.column(ordering).combine_chunks(), spec.ordering_type)
              .to_pylist() if ordering and stored.num_rows else [None] * stored.num_rows)
    for key, part, when, value in zip(stored.column(RECORD_KEY).to_pylist(),
                                      stored.column(PARTITION_PATH).to_pylist(),
                                      stored.column(COMMIT_TIME).to_pylist(), values,
                                      strict=True):
        newest[key] = max(newest.get(key, ""), when)
        for slot in ((key, part), (key, None)):
            if slot not in held or held[slot][0] < when:
                held[slot] = (when, value)
    # With event time, a record tying its stored version is judged by arrival.
    tie = np.zeros(rows.num_rows, dtype=bool)
    tie_commit: list[str] = [""] * rows.num_rows
    if ordering:
        mine = rows.column(ORDERING).to_pylist()
        for i in np.flatnonzero(~unordered).tolist():
            found = held.get((keys[i], parts[i])) or held.get((keys[i], None))
            if found is not None and found[1] is not None and mine[i] is not None \
                    and ordering_ties(found[1], mine[i]):
                tie[i], tie_commit[i] = True, found[0]
    judged = unordered | tie
    covered = _arrivals(table, [c for c, j in zip(coordinates, judged, strict=True) if j])
    late: Late = {}
    for i in np.flatnonzero(judged).tolist():
        c = coordinates[i]
        # When the record arrived: its micro-batch's data commit, else (that batch wrote no
        # data) the error-table commit that took it, which a later update of its row moves
        # later.
        row_commit = str(by_coordinates[c][COMMIT_TIME])
        taken = min(covered.get(c, row_commit), row_commit)
        if superseded[i]:
            late[c] = SUPERSEDED_IN_BATCH
        elif (tie_commit[i] if tie[i] else newest.get(keys[i], "")) > taken:
            late[c] = STORED_LATER
    keep = np.array([c not in late for c in coordinates], dtype=bool)
    return rows.filter(pa.array(keep)), late


def _write(sink: HudiStreamingSink, rows: pa.Table, by_coordinates: Mapping[Coordinates, Any],
           replay_id: str, replayed: list[Coordinates], error_table: str,
           still_held: Callable[[], None]) -> tuple[str | None, Late]:
    """Write the prepared ``rows`` (arrival order) in one instant of the table, as the sink
    writes a batch: begin the instant first, then judge which rows are late against the
    table as of then (:func:`_drop_late`), resolve the rest as the sink resolves a batch
    and commit — refused (:class:`~engine.errors.WriteConflictError`, the instant rolled
    back) if a commit that completed since the instant began wrote one of its file groups,
    under every concurrency mode (non-blocking writers of logs included): that commit may
    hold a version the judgement did not see. Returns the instant time (None: nothing left
    to write, the instant rolled back) and the late rows."""
    table, spec = sink.table, sink.spec
    if not table.exists:
        with contextlib.suppress(TableExistsError):  # the job created it meanwhile
            table.materialize()
    client = WriteClient(table.storage, table.config, table.write_config)
    client.delete_policy = POLICY  # a moved key's old copy: deleted as the sink deletes it
    timeline, inflight = client.begin()
    try:
        rows, late = _drop_late(table, rows, by_coordinates, spec)
        records, deletes = _resolved(sink, rows, client, timeline)
        if records is None and deletes is None:
            client.abort(inflight)
            return None, late
        extra = {REPLAY_ID_KEY: replay_id, REPLAY_RECORDS_KEY: encode_records(replayed),
                 REPLAY_ERROR_TABLE_KEY: error_table}
        plan = client.plan(timeline, inflight, UPSERT_OPERATION, records, deletes, extra)
        stats = client.execute_local(plan)
        with client.lock:
            # Hudi's file-group rule (SimpleConcurrentFileWritesConflictResolutionStrategy)
            # for the replay whatever the table's mode: under non-blocking concurrency log
            # writers never conflict, and a job commit since the judgement would lose a tie
            # (or its newer commit-time version) to this later-completing one.
            check_conflicts(timeline, Timeline.load(table.storage, table.config), inflight,
                            stats, non_blocking=False)
            still_held()
            done = client.commit(timeline, plan, stats)
    except BaseException:
        client.abort(inflight)
        raise
    return done.requested_time, late


def _resolved(sink: HudiStreamingSink, rows: pa.Table, client: WriteClient,
              timeline: Timeline) -> tuple[pa.Table | None, pa.Table | None]:
    """The records and deletes the write client takes: ``rows`` resolved as the sink
    resolves a batch (remembered deletes; a tombstone deletes its key in every partition
    it is stored in)."""
    table, spec = sink.table, sink.spec
    event_time = spec.event_time
    ordering = table.config.precombine_field if event_time else None
    tombstones = rows.filter(pc.and_(pc.equal(rows.column(OP), DELETE),
                                     rows.column(ORDERING_NULL) if event_time
                                     else pa.array(np.ones(rows.num_rows, bool))))
    stored = _stored(table, tombstones.column(RECORD_KEY).to_pylist(), ordering)
    where: dict[str, list[str]] = {}
    for key, part in zip(stored.column(RECORD_KEY).to_pylist(),
                         stored.column(PARTITION_PATH).to_pylist(), strict=True):
        where.setdefault(key, []).append(part)
    live: dict[str, Any] = dict.fromkeys(where)
    if ordering and stored.num_rows:  # the comparable form, as prepare's ordering column
        values = ordering_column(stored.column(ordering).combine_chunks(), spec.ordering_type)
        for key, value in zip(stored.column(RECORD_KEY).to_pylist(), values.to_pylist(),
                              strict=True):
            held = live[key]
            live[key] = value if held is None or (value is not None and value > held) else held
    resolved = resolve(rows, columns=VERSIONS, event_time=event_time, policy=POLICY,
                       stored=live)
    data_names = [f.name for f in sink.data_schema]
    upserts = resolved.upserts.select(data_names) if resolved.upserts.num_rows else None
    deletes = _deletes(resolved.deletes, where, spec, ordering)
    records = client.prepare(upserts, timeline, dedupe=True)[0] if upserts is not None else None
    return records, deletes


def _deletes(rows: pa.Table, where: Mapping[str, list[str]], spec: Any,
             ordering: str | None) -> pa.Table | None:
    """The resolved deletes as the write client takes them: key, partition path (a
    tombstone's: every partition its key is stored in) and, with event time, the ordering
    value in the field's type."""
    if not rows.num_rows:
        return None
    out: dict[str, list[Any]] = {RECORD_KEY: [], PARTITION_PATH: []}
    values = (field_ordering(rows.column(ORDERING).combine_chunks(), spec.ordering_type)
              .to_pylist() if ordering else [None] * rows.num_rows)
    if ordering:
        out[ordering] = []
    for key, partition, value in zip(rows.column(RECORD_KEY).to_pylist(),
                                     rows.column(PARTITION_PATH).to_pylist(), values,
                                     strict=True):
        for part in ([partition] if partition is not None else where.get(key, [])):
            out[RECORD_KEY].append(key)
            out[PARTITION_PATH].append(part)
            if ordering:
                out[ordering].append(value)
    if not out[RECORD_KEY]:
        return None
    types = {RECORD_KEY: pa.string(), PARTITION_PATH: pa.string()}
    if ordering:
        types[ordering] = spec.ordering_type
    return pa.table({k: pa.array(v, types[k]) for k, v in out.items()})


def _mark(errors: Table, updates: list[dict[str, Any]], replay_id: str) -> str:
    """Write the changed error rows (marked, or with their new reason) in one commit."""
    data = pa.Table.from_pylist([{f.name: row.get(f.name) for f in ERROR_SCHEMA}
                                 for row in updates], schema=ERROR_SCHEMA)
    return errors.upsert(data, extra_metadata={REPLAY_ID_KEY: replay_id})
