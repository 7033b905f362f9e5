"""The change feed: what each commit of a range inserted, updated and deleted.

Hudi's CDC query (``hoodie.datasource.query.type=incremental`` with
``hoodie.datasource.query.incremental.format=cdc``, RFC-51) returns one row per record a commit
changed, Debezium-style: ``op`` (``i`` insert, ``u`` update, ``d`` delete), ``ts_ms`` (the
commit's instant time), ``before`` and ``after`` (the record's data columns before and after
the commit, as JSON text; ``before`` null for ``i``, ``after`` null for ``d``). A latest-state
incremental read (:meth:`engine.read.reader.TableReader.incremental_scan`) cannot carry a
delete: a deleted record has no version left to return, so a table fed from such a read keeps
it forever. The change feed is what keeps a chain of tables equal.

tidelake writes no CDC log files (``hoodie.table.cdc.enabled`` stays false); the changes are
inferred on the fly, as Hudi's reader infers them where no CDC file exists
(``HoodieCDCExtractor``, ``HoodieCDCInferenceCase``): for each commit, the file groups it wrote
(its write stats) and replaced are read as of the commit before it and as of the commit, and
compared by record key and partition path — a key whose version in the later read is another
write's (commit time and sequence number) than in the earlier one, or that the earlier read
lacks, was updated or inserted; a key of the earlier read missing from the later one was
deleted (a delete block, a copy-on-write rewrite without it, a replaced file group, a
partition move's old copy). What counts is what a snapshot read returns before and after the
commit, so the feed follows the merge rules exactly: on merge-on-read, a natural-order delete
followed by a lower-ordered insert lets the base file's row stand again (docs/engine.md,
"Delete ordering rules"), and the feed reports that row as inserted again. Compactions and
clusterings change no record and are skipped. Where Hudi's CDC query needs
``hoodie.table.cdc.enabled=true`` on the table, this works on every table tidelake reads.

Each commit of the range yields its own rows (a key updated by two commits: two ``u`` rows),
so insert → delete → insert within one range shows as it happened (RFC-51). A range from the
first commit on (``start`` None) returns the table as of ``end`` as inserts instead of
replaying its whole history; a range that reaches archived commits is refused
(:class:`~engine.errors.InstantNotReadableError`), as Hudi's CDC query reads active instants
only. Cost: two reads of every file group a commit wrote, per commit.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import InstantNotReadableError
from engine.layout.view import TableView
from engine.read.reader import ReadSpec, TableReader
from engine.schema import COMMIT_SEQNO, COMMIT_TIME, META_FIELDS, PARTITION_PATH, RECORD_KEY
from engine.storage import Storage
from engine.timeline.active import DATA_ACTION_NAMES, Timeline, completion_key
from engine.timeline.instant import Instant

__all__ = ["CDC_SCHEMA", "DELETE", "INSERT", "UPDATE", "change_commits", "read_changes"]

INSERT, UPDATE, DELETE = "i", "u", "d"
CDC_SCHEMA = pa.schema([("op", pa.string()), ("ts_ms", pa.string()),
                        ("before", pa.string()), ("after", pa.string())])
"""The change feed's columns, as Hudi's CDC query returns them (``CDCRelation``)."""

SERVICE_OPERATIONS = frozenset({"COMPACT", "LOG_COMPACT", "CLUSTER"})
"""Commit ``operationType`` values (Hudi's ``WriteOperationType`` names, as on disk) of table
services, which rewrite records without changing one."""


def change_commits(timeline: Timeline, start: str | None, end: str | None, *,
                   start_inclusive: bool = False) -> list[Instant]:
    """The completed data instants whose completion key is in (``start``, ``end``] (``[`` with
    ``start_inclusive``; None: unbounded) that may change records (no compaction or
    clustering), in completion order."""
    found = []
    for instant in timeline.completed_data_instants:
        done = completion_key(instant)
        if end is not None and done > end:
            break
        if start is not None and (done < start or (done == start and not start_inclusive)):
            continue
        operation = timeline.commit_metadata(instant).operation_type.upper()
        if operation not in SERVICE_OPERATIONS:
            found.append(instant)
    return found


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"no JSON form for {type(value).__name__}")


def _image(row: dict[str, Any] | None, columns: list[str]) -> str | None:
    if row is None:
        return None
    return json.dumps({c: row.get(c) for c in columns}, default=_json_value,
                      ensure_ascii=False)


class _Reads:
    """Reads of chosen file groups as of chosen completion keys, sharing one listing."""

    def __init__(self, storage: Storage, timeline: Timeline) -> None:
        self.storage = storage
        self.timeline = timeline
        self.reader = TableReader(storage, timeline)
        self._files: Any = None

    def rows(self, at: str | None, groups: set[tuple[str, str]] | None) -> pa.Table | None:
        """The rows of ``groups`` (None: all) as of the completion key ``at`` (meta columns
        as plain strings; None: nothing, or ``at`` None — before the first commit)."""
        if at is None:
            return None
        view = TableView(self.storage, self.timeline, end_completion=at)
        if self._files is not None:
            view._files = self._files  # the raw listing: visibility is applied per view
        scan = self.reader.scan(ReadSpec(None, None, False), view)
        self._files = view._files
        slices = [s for s in scan.slices
                  if groups is None or (s.partition_path, s.file_id) in groups]
        parts = [p for p in (scan.slice_scan.read(s) for s in slices) if p.num_rows]
        if not parts:
            return None
        table = pa.concat_tables(parts, promote_options="permissive")
        return table.cast(pa.schema([pa.field(f.name, f.type.value_type)
                                     if pa.types.is_dictionary(f.type) else f
                                     for f in table.schema]))


_IDENTITY = [RECORD_KEY, PARTITION_PATH]


def _positions(table: pa.Table, tag: str) -> pa.Table:
    """The identity and version columns of ``table`` with each row's position (``tag``)."""
    return pa.table({RECORD_KEY: table.column(RECORD_KEY),
                     PARTITION_PATH: table.column(PARTITION_PATH),
                     f"{tag}_time": table.column(COMMIT_TIME),
                     f"{tag}_seqno": table.column(COMMIT_SEQNO),
                     tag: pa.array(range(table.num_rows), pa.int64())})


def _diff(before: pa.Table | None, after: pa.Table | None
          ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any] | None, dict[str, Any]]]]:
    """The rows of ``before`` whose (key, partition) ``after`` lacks (deleted), and the rows
    of ``after`` that are new or another write's version than in ``before``, with that
    version (inserted or updated); each by key and partition. Only these rows are turned
    into Python objects (an Arrow join finds them)."""
    if after is None:
        gone = before.to_pylist() if before is not None else []
        return sorted(gone, key=lambda r: (r[RECORD_KEY], r[PARTITION_PATH])), []
    if before is None:
        new = sorted(after.to_pylist(), key=lambda r: (r[RECORD_KEY], r[PARTITION_PATH]))
        return [], [(None, r) for r in new]
    b, a = _positions(before, "b"), _positions(after, "a")
    gone_at = b.join(a.select(_IDENTITY), keys=_IDENTITY, join_type="left anti")
    gone_at = gone_at.sort_by([(RECORD_KEY, "ascending"), (PARTITION_PATH, "ascending")])
    joined = a.join(b, keys=_IDENTITY, join_type="left outer")
    changed = joined.filter(pc.or_kleene(
        pc.is_null(joined.column("b")),
        pc.or_(pc.not_equal(joined.column("a_time"), joined.column("b_time")),
               pc.not_equal(joined.column("a_seqno"), joined.column("b_seqno")))))
    changed = changed.sort_by([(RECORD_KEY, "ascending"), (PARTITION_PATH, "ascending")])
    gone = before.take(gone_at.column("b")).to_pylist()
    new = after.take(changed.column("a")).to_pylist()
    held_at = changed.column("b").to_pylist()
    held = iter(before.take(pc.drop_null(changed.column("b"))).to_pylist())
    return gone, [(next(held) if at is not None else None, row)
                  for at, row in zip(held_at, new, strict=True)]


def _check_active(timeline: Timeline, start: str, done: list[Instant]) -> None:
    """Refuse a range that reaches archived commits: their file groups before and after
    cannot be told apart from the active timeline (Hudi: "only instants that are active can
    be queried" by a CDC query), and skipping them would lose their changes silently."""
    first = completion_key(done[0]) if done else None
    if first is not None and start >= first:
        return
    archived = [row for row in timeline.archived() if row.action in DATA_ACTION_NAMES
                and (row.completion_time or row.requested_time) > start]
    if archived:
        earliest = first or ""
        raise InstantNotReadableError(
            f"the change feed from {start} is not possible: commits after it are archived "
            f"(the first, {archived[0].requested_time}); the feed reads active commits only, "
            f"from {earliest} on (hoodie.keep.min.commits sets how many stay active)",
            earliest)


def read_changes(storage: Storage, timeline: Timeline, start: str | None,
                 end: str | None = None, *, start_inclusive: bool = False) -> pa.Table:
    """The change feed (:data:`CDC_SCHEMA`) of the commits completed in (``start``,
    ``end``] (see the module doc; ``start`` None: the table as of ``end`` as inserts)."""
    reads = _Reads(storage, timeline)
    done = list(timeline.completed_data_instants)
    if start is not None:
        _check_active(timeline, start, done)
    if end is None:
        end = completion_key(done[-1]) if done else None
    schema = reads.reader.table_schema()
    columns = [n for n in schema.names if n not in META_FIELDS] if schema is not None else []
    out: list[tuple[str, str, str | None, str | None]] = []
    if start is None:
        for _, row in _diff(None, reads.rows(end, None))[1]:
            out.append((INSERT, row[COMMIT_TIME], None, _image(row, columns)))
    else:
        keys = sorted(completion_key(i) for i in done)
        for commit in change_commits(timeline, start, end, start_inclusive=start_inclusive):
            at = completion_key(commit)
            before_at = max((k for k in keys if k < at), default=None)
            meta = timeline.commit_metadata(commit)
            groups = {(s.partition_path, s.file_id) for s in meta.write_stats}
            groups |= {(p, f) for p, ids in meta.partition_to_replace_file_ids.items()
                       for f in ids}
            gone, changed = _diff(reads.rows(before_at, groups), reads.rows(at, groups))
            ts = commit.requested_time
            # deletes first: a partition move is the old copy's delete, then the new insert
            out += [(DELETE, ts, _image(row, columns), None) for row in gone]
            out += [(UPDATE if held is not None else INSERT, ts, _image(held, columns),
                     _image(row, columns)) for held, row in changed]
    return pa.table({"op": [r[0] for r in out], "ts_ms": [r[1] for r in out],
                     "before": [r[2] for r in out], "after": [r[3] for r in out]},
                    schema=CDC_SCHEMA)
