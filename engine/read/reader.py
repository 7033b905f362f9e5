"""Readers: snapshot, read-optimized, incremental and time-travel views into Arrow.

Every view is built the same way: choose the visible completed instants, take the file
slices they see (:class:`engine.layout.view.TableView`), prune slices by partition, then read each
slice — base file, plus for merge-on-read its log blocks merged by key
(:class:`engine.read.slice_reader.SliceReader`). Uncommitted and rolled-back files are never
read.
"""

from __future__ import annotations

import decimal
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.config import TableConfig
from engine.errors import InvalidRecordError
from engine.format import timestamps
from engine.format.base_file import read_footer_keys
from engine.index.bucket import bucket_ids
from engine.layout.file_group import FileSlice, Visibility
from engine.layout.keygen import parse_field_string, record_keys
from engine.layout.partition import DEFAULT_PARTITION, decode_partition_value
from engine.layout.view import TableView, live_buckets
from engine.read.retention import check_readable
from engine.read.scan import Scan, SliceScan
from engine.read.skipping import KEY_PRUNERS, Pruning, prune
from engine.schema import META_FIELDS, RECORD_KEY, table_schema
from engine.storage import Storage
from engine.timeline.active import Timeline

READ_THREADS = min(max(os.cpu_count() or 2, 2), 16)
"""Slices a read decodes and merges at once, one per core: each slice is decoded on its own
thread (not by pyarrow's column threads), so one slice's merge overlaps another's decode."""
Filters: TypeAlias = "pc.Expression | Sequence[Any] | None"


@dataclass(frozen=True)
class ReadSpec:
    """What to read: columns (None = all), filters, and base-files-only."""

    columns: Sequence[str] | None = None
    filters: Filters = None
    read_optimized: bool = False


def to_expression(filters: Filters) -> pc.Expression | None:
    """Filters as a pyarrow expression (accepts an expression or DNF tuples)."""
    if filters is None:
        return None
    if isinstance(filters, pc.Expression):
        return filters
    if not filters:
        return None
    try:
        return pq.filters_to_expression(filters)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"filters: {exc}") from None


def partition_values(path: str, config: TableConfig) -> dict[str, str | None]:
    """Partition field values encoded in a partition path (strings, None for default).

    Values are ``%XX``-decoded only for tables that record
    ``hoodie.datasource.write.partitionpath.urlencode=true`` (the others store them as is).
    """
    fields = config.partition_fields
    if not fields or not path:
        return {}
    segments = path.split("/")
    values: dict[str, str | None] = {}
    if config.hive_style:
        for seg in segments:
            name, _, value = seg.partition("=")
            values[name] = value
    elif len(segments) == len(fields):
        values = dict(zip(fields, segments, strict=True))
    else:
        return {}

    def decode(value: str) -> str:
        return decode_partition_value(value) if config.url_encode else value

    return {k: None if v == DEFAULT_PARTITION else decode(v or "")
            for k, v in values.items()}


def filters_as_columns(filters: Filters, schema: pa.Schema | None) -> Filters:
    """DNF ``filters`` with ``datetime`` values in the kind of their timestamp column
    (:func:`engine.format.timestamps.value_as`): a zone-less value filters a column of
    instants as UTC wall-clock time, as writes store it; ``Decimal`` values against a
    decimal column at its scale (:func:`decimal_term`). Expressions are left as they are."""
    if (filters is None or isinstance(filters, pc.Expression) or not filters
            or schema is None):
        return filters
    dnf = [filters] if isinstance(filters[0], tuple) else list(filters)

    def term(item: Any) -> Any:
        if not (isinstance(item, tuple) and len(item) == 3 and item[0] in schema.names):
            return item
        name, op, value = item
        kind = schema.field(name).type
        if pa.types.is_decimal(kind):
            return decimal_term(name, op, value, kind)
        if isinstance(value, list | tuple | set):
            value = type(value)(timestamps.value_as(v, kind) for v in value)
        else:
            value = timestamps.value_as(value, kind)
        return (name, op, value)

    return [[term(item) for item in conj] for conj in dnf]


def decimal_term(name: str, op: str, value: Any, kind: pa.DataType) -> tuple[str, str, Any]:
    """The term ``(name, op, value)`` on a decimal column of type ``kind`` with its
    ``Decimal`` values at the column's scale, so that comparing them never widens the
    column past Arrow's precision (a ``decimal128(38, 10)`` column against ``0.0156250000001``
    needs 41 digits: pyarrow raises). A value the column cannot hold (more digits after the
    point, or beyond its precision) is compared exactly through one it can hold: no row
    equals it (``=``, ``in`` drop it; ``!=`` holds for every non-null value), and
    ``<``/``<=`` it are ``<=`` the nearest value below it, ``>``/``>=`` it ``>=`` the
    nearest above (the column's bound when it is beyond them). Other values are left as they
    are."""
    step = decimal.Decimal(1).scaleb(-kind.scale)
    top = (decimal.Decimal(10) ** kind.precision - 1).scaleb(-kind.scale)  # the largest held
    digits = decimal.Context(prec=kind.precision + 2)

    def at_scale(v: decimal.Decimal, rounding: str) -> decimal.Decimal:
        return v.quantize(step, rounding=rounding, context=digits)

    unheld = object()

    def held(v: Any) -> Any:
        """``v`` at the column's scale if the column holds it exactly, else ``unheld`` (a
        value of another kind, None included: as it is)."""
        if not isinstance(v, decimal.Decimal) or not v.is_finite():
            return v
        if abs(v) > top:
            return unheld
        exact = at_scale(v, decimal.ROUND_FLOOR)
        return exact if exact == v else unheld

    if isinstance(value, list | tuple | set):
        return (name, op, [h for h in map(held, value) if h is not unheld])
    exact = held(value)
    if exact is not unheld:
        return (name, op, exact)
    if op in ("=", "=="):
        return (name, "in", [])
    if op == "!=":
        return (name, ">=", -top)
    if op in ("<", "<="):
        if value < -top:
            return (name, "in", [])
        return (name, "<=", top if value > top else at_scale(value, decimal.ROUND_FLOOR))
    if value > top:  # > or >=
        return (name, "in", [])
    return (name, ">=", -top if value < -top else at_scale(value, decimal.ROUND_CEILING))


def _partition_conjuncts(filters: Filters, fields: Sequence[str]) -> list[list[tuple[Any, ...]]]:
    """DNF of the filter terms on partition fields only (empty = no pruning possible)."""
    if filters is None or isinstance(filters, pc.Expression) or not filters:
        return []
    dnf = [filters] if isinstance(filters[0], tuple) else list(filters)
    result = []
    for conj in dnf:
        terms = [t for t in conj if isinstance(t, tuple) and t and t[0] in fields]
        result.append(terms)
    if any(not terms for terms in result):
        return []  # a disjunct without partition terms may match any partition
    return result


def _partition_may_match(path: str, config: TableConfig, schema: pa.Schema,
                         dnf: list[list[tuple[Any, ...]]]) -> bool:
    if not dnf:
        return True
    values = partition_values(path, config)
    if not values:
        return True
    arrays = {}
    for name, raw in values.items():
        if name not in schema.names:
            return True
        try:
            arrays[name] = parse_field_string(raw, schema.field(name).type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            return True
    row = pa.table(arrays)
    try:
        expr = pq.filters_to_expression(dnf)
        return bool(row.filter(expr).num_rows)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError, ValueError):
        return True


MAX_LOOKUP_KEYS = 10_000
"""Key lookups pinning more keys than this read every slice instead (then filter)."""


def lookup_keys(filters: Filters, config: TableConfig,
                schema: pa.Schema | None) -> pa.Array | None:
    """Record keys a DNF filter pins down, else None: every disjunct must pin the key, by
    ``_hoodie_record_key = k`` / ``in [...]`` (the stored key strings) or by ``field = v`` /
    ``field in [...]`` on every record key field.

    Keys from field values are made by the writer's own key generator
    (:func:`engine.layout.keygen.record_keys`) from the values cast to the columns' types, so
    ``id = 2.0`` on a double key finds the stored ``2.0`` and ``id = "x"`` on a complex-key
    table finds ``id:x``. A disjunct that does not pin the key (any key may match), a value
    the key generator refuses or that cannot be cast disables the lookup rather than guess.
    """
    fields = config.record_key_fields
    if (filters is None or isinstance(filters, pc.Expression) or not filters or not fields
            or not config.populate_meta_fields or schema is None
            or any(f not in schema.names for f in fields)):
        return None
    dnf = [filters] if isinstance(filters[0], tuple) else list(filters)
    combos: list[tuple[Any, ...]] = []
    stored: list[str] = []
    for conj in dnf:
        direct = _pinned(conj, RECORD_KEY)
        if direct is not None:
            if not all(isinstance(k, str) for k in direct):
                return None
            stored += direct
        else:
            per_field = [_pinned(conj, name) for name in fields]
            if any(values is None for values in per_field):
                return None
            size = 1
            for values in per_field:
                size *= len(values or ())
            if len(combos) + size > MAX_LOOKUP_KEYS:
                return None
            combos.extend(itertools.product(*(values or () for values in per_field)))
        if len(combos) + len(stored) > MAX_LOOKUP_KEYS:
            return None
    keys = pa.array(stored, pa.string())
    if combos:
        try:
            columns = [pa.array([c[i] for c in combos]).cast(schema.field(name).type)
                       for i, name in enumerate(fields)]
            if any(column.null_count for column in columns):
                return None
            made = record_keys(pa.Table.from_arrays(columns, names=list(fields)), config)
        except (InvalidRecordError, pa.ArrowInvalid, pa.ArrowNotImplementedError,
                pa.ArrowTypeError, TypeError, ValueError):
            return None
        keys = pa.concat_arrays([keys, made.cast(pa.string())])
    return pc.unique(keys).sort()


def _pinned(conj: Sequence[Any], name: str) -> list[Any] | None:
    """The values one conjunction allows for ``name`` by ``=`` / ``in`` terms (their
    intersection), None when no such term constrains it."""
    values: list[Any] | None = None
    for term in conj:
        if not (isinstance(term, tuple) and len(term) == 3 and term[0] == name):
            continue
        _, op, value = term
        if op in ("=", "=="):
            these = [value]
        elif op == "in" and isinstance(value, list | tuple | set):
            these = list(value)
        else:
            continue
        values = these if values is None else [v for v in values if v in these]
    return values


def _slice_may_hold(storage: Storage, slc: FileSlice, keys: pa.Array) -> bool:
    """False when the base file's footer rules every key out and there are no logs."""
    if slc.log_files or slc.base_file is None:
        return True
    try:
        with storage.open_input(slc.base_file.path, whole=False) as source:
            footer = read_footer_keys(source)
    except (OSError, ValueError):
        return True
    candidates = keys.to_pylist()
    if footer.min_key is not None and footer.max_key is not None:
        # Hudi's min/max follow Java's String order: UTF-16 code units, i.e. UTF-16-BE bytes.
        low, high = (footer.min_key.encode("utf-16-be"), footer.max_key.encode("utf-16-be"))
        candidates = [k for k in candidates if low <= k.encode("utf-16-be") <= high]
    if footer.bloom is not None:
        candidates = [k for k in candidates if footer.bloom.might_contain(k)]
    return bool(candidates)


class TableReader:
    """Snapshot, read-optimized, time-travel and incremental reads of one table."""

    def __init__(self, storage: Storage, timeline: Timeline) -> None:
        self.storage = storage
        self.timeline = timeline
        self.config = timeline.config

    def table_schema(self) -> pa.Schema | None:
        """Arrow schema (meta fields first) from the latest commit's Avro schema; None if no
        commit recorded one; :class:`~engine.errors.CorruptTableError` naming the file if
        the recorded schema cannot be parsed."""
        return table_schema(self.timeline)

    def plan(self, spec: ReadSpec, view: TableView, *, latest: bool = False
             ) -> tuple[list[FileSlice], pa.Array | None, Pruning]:
        """The slices a read of ``view`` with ``spec`` reads, the record keys its filter pins
        (None if it pins none), and what data skipping pruned (``latest``: ``view`` is the
        table's latest snapshot, so partition stats and the record index apply).

        Slices are pruned by partition values (the folders' names, where they are the
        fields' values: :attr:`~engine.config.TableConfig.partition_paths_hold_values`),
        then for a key-equality filter by the record index
        (:data:`~engine.read.skipping.KEY_PRUNERS`) or, when it cannot tell, by bucket id
        and base-file footers, then by partition and column statistics."""
        schema = self.table_schema()
        spec = ReadSpec(spec.columns, filters_as_columns(spec.filters, schema),
                        spec.read_optimized)
        slices = view.latest_file_slices()
        dnf = _partition_conjuncts(spec.filters, self.config.partition_fields) \
            if self.config.partition_paths_hold_values else []
        if dnf and schema is not None:
            slices = [s for s in slices
                      if _partition_may_match(s.partition_path, self.config, schema, dnf)]
        wanted = [s for s in slices if not (spec.read_optimized and s.base_file is None)]
        total = len(wanted)
        by_index = by_footer = 0
        keys = lookup_keys(spec.filters, self.config, schema)
        if keys is not None:
            located = False
            if latest and not spec.read_optimized:
                for pruner in KEY_PRUNERS:  # the record index
                    groups = pruner(view, keys)
                    if groups is not None:
                        located = True
                        wanted = [s for s in wanted if (s.partition_path, s.file_id) in groups]
                by_index = total - len(wanted)
            if not located:
                kept = self._prune_for_keys(view, wanted, keys)
                by_footer = len(wanted) - len(kept)
                wanted = kept
        wanted, report = prune(view, wanted, spec.filters, schema, latest=latest)
        report.slices = total
        report.partitions = len({s.partition_path for s in slices})
        report.slices_pruned_by_record_index = by_index
        report.slices_pruned_by_bucket_or_footer = by_footer
        return wanted, keys, report

    def scan(self, spec: ReadSpec, view: TableView, *, latest: bool = False) -> Scan:
        """Plan a read of ``view`` (a snapshot of this reader's timeline) with ``spec``'s
        columns and filters (``latest``: see :meth:`plan`): the slices to read and how to
        read each (:class:`~engine.read.scan.Scan`)."""
        schema = self.table_schema()
        spec = ReadSpec(spec.columns, filters_as_columns(spec.filters, schema),
                        spec.read_optimized)
        wanted, keys, report = self.plan(spec, view, latest=latest)
        slice_scan = SliceScan(
            self.storage, self.timeline, view.visible, schema,
            read_columns=self._read_columns(spec, schema), read_optimized=spec.read_optimized,
            expr=to_expression(spec.filters), keys=keys,
            columns=list(spec.columns) if spec.columns is not None else None,
            as_of=view.visible.as_of or max(view.visible.active, default=None))
        report.slices_read = len(wanted)
        return Scan(slice_scan, wanted, report, spec.columns)

    def read(self, spec: ReadSpec, view: TableView, *, latest: bool = False) -> pa.Table:
        """Read ``view`` (a snapshot of this reader's timeline) with ``spec``'s columns and
        filters (``latest``: see :meth:`plan`)."""
        return self.scan(spec, view, latest=latest).to_table(threads=READ_THREADS)

    def _prune_for_keys(self, view: TableView, slices: list[FileSlice],
                        keys: pa.Array) -> list[FileSlice]:
        """Slices that may hold one of ``keys``: by bucket, then by base file footers. A key
        lives in its bucket's group: of the live bucket groups placement puts keys in
        (:func:`~engine.layout.view.live_buckets` under the table's recorded index, with
        its recorded bucket count), those of other buckets are left out; any other group
        may hold it."""
        num_buckets = self.config.num_buckets
        live = (live_buckets(view, self.config.index_type)
                if num_buckets and not self.config.consistent_hashing  # rings name no bucket
                else {})
        try:
            buckets = set(bucket_ids(keys, num_buckets).tolist()) if live and num_buckets \
                else None
        except ValueError:  # a key no writer can have stored: prune by footers only
            buckets = None
        if buckets is not None:
            bucket_of = {(part, fid): bucket for (part, bucket), fid in live.items()}
            wanted = {None, *buckets}  # None: not a bucket group
            slices = [s for s in slices
                      if bucket_of.get((s.partition_path, s.file_id)) in wanted]
        return [s for s in slices if _slice_may_hold(self.storage, s, keys)]

    def _read_columns(self, spec: ReadSpec, schema: pa.Schema | None) -> list[str] | None:
        if spec.columns is None:
            return None
        wanted = list(dict.fromkeys(list(META_FIELDS) + list(spec.columns)))
        if self.config.precombine_field:
            wanted.append(self.config.precombine_field)
        if spec.filters is not None:
            expr = to_expression(spec.filters)
            if schema is not None and expr is not None:
                wanted.extend(n for n in schema.names if n in str(expr))
        if schema is not None:
            unknown = [c for c in spec.columns if c not in schema.names]
            if unknown:
                raise ValueError(f"columns: no column {unknown[0]!r} in the table")
            return [c for c in dict.fromkeys(wanted) if c in schema.names]
        return list(dict.fromkeys(wanted))

    def reloaded(self, *, as_of: str | None = None, start: str | None = None) -> TableReader:
        """A reader of the timeline as it is now; raises
        :class:`~engine.errors.InstantNotReadableError` if a read as of ``as_of`` (or from
        ``start``) reaches before what the cleaner keeps now."""
        timeline = Timeline.load(self.storage, self.config)
        check_readable(timeline, as_of=as_of, start=start)
        return TableReader(self.storage, timeline)

    def snapshot_scan(self, spec: ReadSpec, as_of: str | None = None) -> Scan:
        """Plan a snapshot (or time travel ``as_of`` an instant time) of the table; the plan
        plans itself again on a reloaded timeline if a file it holds is gone at read time
        (:meth:`~engine.read.scan.Scan.to_table`)."""
        scan = self.scan(spec, TableView(self.storage, self.timeline, as_of=as_of),
                         latest=as_of is None)
        scan.replan = lambda: self.reloaded(as_of=as_of).snapshot_scan(spec, as_of)
        return scan

    def snapshot(self, spec: ReadSpec, as_of: str | None = None) -> pa.Table:
        """Snapshot (or time travel ``as_of`` an instant time) of the table."""
        return self.snapshot_scan(spec, as_of).to_table(threads=READ_THREADS)

    def incremental_scan(self, start: str | None, end: str | None, spec: ReadSpec, *,
                         start_inclusive: bool = False) -> Scan:
        """Plan an incremental read: the latest versions (as of ``end``) of records written
        by commits completed in (start, end] (``start`` None: from the first commit on;
        ``start_inclusive``: in [start, end], as Hudi 1.x's begin instant time).

        Slices whose every file was written by an instant completed by ``start`` are not
        read: a record version lives in a file written by its commit or by a later writer
        that read it (a copy-on-write merge, a compaction, a clustering), each completed at
        or after its commit, so such a slice holds no version of a commit in the range."""
        view = TableView(self.storage, self.timeline, end_completion=end)
        visible = view.visible
        # the columns asked, and what the read needs: the meta fields (the commit range is
        # kept by _hoodie_commit_time), the ordering field and the filter's columns
        scan = self.scan(ReadSpec(spec.columns, spec.filters, False), view)
        if start is not None:  # from the first commit on, every record of the view is in
            in_range = visible.completed_after(start, inclusive=start_inclusive)
            scan.slice_scan.commit_times = tuple(in_range)
            scan.slice_scan.as_of, scan.slice_scan.start = None, start
            named_by_writer = not self.config.table_version.logs_named_by_slice
            scan.slices = [s for s in scan.slices
                           if in_range and _written_after(s, visible, start, start_inclusive,
                                                          named_by_writer)]
        scan.pruning.slices_read = len(scan.slices)
        return scan

    def incremental(self, start: str, end: str | None, spec: ReadSpec) -> pa.Table:
        """Latest versions of records written by commits completed in (start, end]; planned
        again on a reloaded timeline if a planned file is gone at read time."""
        scan = self.incremental_scan(start, end, spec)
        scan.replan = lambda: self.reloaded(start=start).incremental_scan(start, end, spec)
        return scan.to_table(threads=READ_THREADS)


def _written_after(slc: FileSlice, visible: Visibility, start: str, inclusive: bool,
                   logs_named_by_writer: bool = True) -> bool:
    """True if a file of ``slc`` was written by an instant completed after ``start`` (at or
    after, ``inclusive``), or by one the view cannot place (then it may): a log file whose
    name carries its slice's base instant, not its writer's (table version 6), always may."""
    completions = [visible.get(slc.base_file.instant_time)] if slc.base_file is not None else []
    completions += [(log.completion_time or visible.get(log.instant_time))
                    if logs_named_by_writer else None for log in slc.log_files]
    return any(c is None or c > start or (inclusive and c == start) for c in completions)


__all__ = ["RECORD_KEY", "ReadSpec", "Scan", "SliceScan", "TableReader",
           "partition_values"]
