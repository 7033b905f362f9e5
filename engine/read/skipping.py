"""Data skipping: which partitions and file slices a filtered read can leave unread.

Before a read, with DNF filters (``[(column, op, value), ...]`` or a list of such lists):

1. partitions whose ``partition_stats`` rule every disjunct out are dropped (snapshot reads
   of the latest view only: the stats bound the latest slices, not older ones);
2. a file slice is dropped when **every** file of it — base file and log files — is ruled
   out by its ``column_stats``. Log files count (Hudi itself prunes base files only): a
   merged row is always one record of one file of the slice (the merge modes pick whole
   records), so if no file holds a record matching the filter, the slice yields none. A file
   without stats for a filter column can match.

Null semantics are pyarrow's (the filter the read applies afterwards): a comparison with
null is not true, so a file whose values of the column are all null matches no ``=``,
``<``, ``in`` (without None)... term; ``not in`` lets nulls through and is never used to
prune; ``!=`` prunes only a file whose non-null values all equal the value (never on
floating columns, where NaN != v holds). NaN or missing bounds leave a file unprunable.

Key-equality filters on the record key are the record index's (:func:`groups_holding`, over
:mod:`engine.metadata.record_index_lookup`), through :data:`KEY_PRUNERS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.layout.file_group import FileSlice
from engine.metadata import record_index_lookup as rli
from engine.metadata.keys import (
    COLUMN_STATS,
    PARTITION_STATS,
    column_stats_key,
    partition_stats_key,
)
from engine.metadata.records import ColumnStats, bound_value, bounds_unknown

if TYPE_CHECKING:
    from engine.layout.view import TableView

_log = logging.getLogger("engine.read")

Term = tuple[str, str, Any]

def groups_holding(view: TableView, keys: pa.Array) -> set[tuple[str, str]] | None:
    """The (partition, file id) groups holding ``keys`` per the record_index, for a snapshot
    read of the latest ``view`` whose filter pins these record keys
    (:data:`KEY_PRUNERS`); None when the index cannot tell.

    It cannot tell when the table does not declare the partition complete, or when a key may
    live in several groups: a partitioned table whose index is not global keeps a key once per
    partition, and the record_index holds one location per key. (A key written twice by
    ``insert``, which looks nothing up, is found where the index last saw it, as in Hudi.)"""
    config = view.config
    if config.partition_fields and not (config.index_type is not None
                                        and config.index_type.is_global):
        return None
    if not rli.is_kept(view.storage):
        return None
    found = rli.lookup_locations(view.storage, view.timeline, keys).locations
    return set(zip(found.column("loc_partition").to_pylist(),
                   found.column("loc_file_id").to_pylist(), strict=True))


KEY_PRUNERS: list[Callable[[TableView, pa.Array], set[tuple[str, str]] | None]] = [
    groups_holding]
"""The key pruners, the record index's (:func:`groups_holding`): given the
latest view and the record keys a snapshot read's filter pins down, the (partition, file id)
groups that hold them, or None when it cannot tell. The reader keeps only slices of such
groups (every pruner that answers must admit the group); it does not ask for time travel,
incremental or read-optimized reads (an older or base-only slice of another group may still
show a key that has moved)."""


@dataclass
class Pruning:
    """What data skipping did for one read (:meth:`engine.table.Table.explain`)."""

    partitions: int = 0
    partitions_pruned_by_partition_stats: int = 0
    slices: int = 0
    slices_pruned_by_record_index: int = 0
    slices_pruned_by_bucket_or_footer: int = 0
    slices_pruned_by_column_stats: int = 0
    slices_read: int = 0
    files_checked: int = 0
    files_without_stats: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The counts as a plain dict."""
        return dict(self.__dict__)


def dnf_terms(filters: Any) -> list[list[Term]] | None:
    """The filter as a list of conjunctions of ``(column, op, value)`` terms; None when it
    is not in DNF list form (expressions are not used for skipping)."""
    if filters is None or isinstance(filters, pc.Expression) or not filters:
        return None
    dnf = [filters] if isinstance(filters[0], tuple) else list(filters)
    out = []
    for conj in dnf:
        terms = [t for t in conj if isinstance(t, tuple) and len(t) == 3
                 and isinstance(t[0], str)]
        out.append(terms)
    return out


# -- evaluating a term on stats ----------------------------------------------------------------

def _domain_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t




def _value_key(value: Any, t: pa.DataType) -> Any:
    """A filter value in the comparison domain of a column of type ``t`` (raises when it
    cannot be cast exactly)."""
    scalar = pa.scalar(value) if not isinstance(value, pa.Scalar) else value
    cast = scalar.cast(t, safe=True)
    if pa.types.is_timestamp(t):
        return cast.cast(pa.timestamp("ns", t.tz)).cast(pa.int64()).as_py()
    if pa.types.is_date(t):
        return cast.cast(pa.date32()).cast(pa.int32()).as_py()
    out = cast.as_py()
    if isinstance(out, float) and out != out:
        raise ValueError("NaN")
    return out


def term_may_match(term: Term, stats: ColumnStats | None, column_type: pa.DataType) -> bool:
    """False only when no row of a file with ``stats`` can satisfy ``term``."""
    if stats is None or stats.is_deleted:
        return True
    _, op, value = term
    t = _domain_type(column_type)
    if stats.value_count is None or stats.null_count is None or stats.value_count < 0:
        return True
    non_null = stats.value_count - stats.null_count
    if op == "not in":
        return True
    if op == "in" and isinstance(value, list | tuple | set) and any(v is None for v in value):
        if stats.null_count > 0:
            return True
        value = [v for v in value if v is not None]
    if non_null <= 0 and stats.value_count >= 0:
        return False
    if bounds_unknown(stats):
        return True
    assert stats.min_value is not None and stats.max_value is not None
    try:
        # the bounds' domain (bound_value): timestamps in epoch nanoseconds, dates in
        # epoch days, decimals as Decimal, as _value_key casts the filter's value
        lo = bound_value(stats.min_value, stats.value_type)
        hi = bound_value(stats.max_value, stats.value_type)
        if isinstance(lo, float) and (lo != lo or hi != hi):
            return True
        if op in ("=", "=="):
            v = _value_key(value, t)
            return bool(lo <= v <= hi)
        if op == "in":
            if not isinstance(value, list | tuple | set):
                return True
            return any(lo <= v <= hi for v in (_value_key(x, t) for x in value))
        if op == "<":
            return bool(lo < _value_key(value, t))
        if op == "<=":
            return bool(lo <= _value_key(value, t))
        if op == ">":
            return bool(hi > _value_key(value, t))
        if op == ">=":
            return bool(hi >= _value_key(value, t))
        if op == "!=":
            if pa.types.is_floating(t):
                return True
            v = _value_key(value, t)
            return not (lo == v == hi)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError,
            ValueError, OverflowError):
        return True
    return True


def may_match(dnf: Sequence[Sequence[Term]], stats: Mapping[str, ColumnStats | None],
              schema: pa.Schema) -> bool:
    """Whether a file (or partition) with these per-column stats can hold a row matching
    the DNF filter."""
    for conj in dnf:
        ok = True
        for term in conj:
            if term[0] not in schema.names:
                continue
            if not term_may_match(term, stats.get(term[0]), schema.field(term[0]).type):
                ok = False
                break
        if ok:
            return True
    return False


# -- pruning a read ----------------------------------------------------------------------------

def _lookup(view: TableView, partition_name: str, keys: list[str]) -> dict[str, ColumnStats]:
    from engine.metadata.lookups import lookup

    found, _ = lookup(view.storage, view.timeline, partition_name, keys)
    return {key: record.payload for key, record in found.items()
            if isinstance(record.payload, ColumnStats) and not record.payload.is_deleted}


def prune(view: TableView, slices: Sequence[FileSlice], filters: Any,
          schema: pa.Schema | None, *, latest: bool) -> tuple[list[FileSlice], Pruning]:
    """The slices a read with ``filters`` must read, and what was pruned (module
    docstring). ``latest``: the view is the table's latest snapshot (partition stats
    apply)."""
    from engine.metadata.table import declared_partitions, is_metadata_storage

    report = Pruning(partitions=len({s.partition_path for s in slices}), slices=len(slices))
    kept = list(slices)
    dnf = dnf_terms(filters)
    if (dnf is None or schema is None or not kept
            or not view.config.table_version.keeps_metadata_table
            or is_metadata_storage(view.storage)):
        report.slices_read = len(kept)
        return kept, report
    columns = sorted({t[0] for conj in dnf for t in conj if t[0] in schema.names})
    declared = set(declared_partitions(view.storage))
    if not columns:
        report.slices_read = len(kept)
        return kept, report
    if latest and PARTITION_STATS.name in declared and view.config.partition_fields:
        partitions = sorted({s.partition_path for s in kept})
        keys = {partition_stats_key(c, p): (p, c) for p in partitions for c in columns}
        found = _lookup(view, PARTITION_STATS.name, list(keys))
        per: dict[str, dict[str, ColumnStats | None]] = {p: {} for p in partitions}
        for key, (p, c) in keys.items():
            per[p][c] = found.get(key)
        dropped = {p for p in partitions if not may_match(dnf, per[p], schema)}
        report.partitions_pruned_by_partition_stats = len(dropped)
        kept = [s for s in kept if s.partition_path not in dropped]
    if COLUMN_STATS.name in declared and kept:
        files = [(s, name) for s in kept for name in _names(s)]
        keys2 = {column_stats_key(c, s.partition_path, n): (s.partition_path, n, c)
                 for s, n in files for c in columns}
        found = _lookup(view, COLUMN_STATS.name, list(keys2))
        per_file: dict[tuple[str, str], dict[str, ColumnStats | None]] = {}
        for key, (p, n, c) in keys2.items():
            per_file.setdefault((p, n), {})[c] = found.get(key)
        report.files_checked = len(files)
        report.files_without_stats = sum(
            1 for s, n in files if all(v is None for v in per_file[(s.partition_path, n)].values()))
        survivors = []
        for slc in kept:
            if any(may_match(dnf, per_file[(slc.partition_path, n)], schema)
                   for n in _names(slc)) or not _names(slc):
                survivors.append(slc)
        report.slices_pruned_by_column_stats = len(kept) - len(survivors)
        kept = survivors
    report.slices_read = len(kept)
    _log.debug("data skipping: %d of %d partitions pruned by partition_stats, %d of %d "
               "file slices pruned by column_stats (%d files checked, %d without stats), "
               "%d slices read", report.partitions_pruned_by_partition_stats,
               report.partitions, report.slices_pruned_by_column_stats, report.slices,
               report.files_checked, report.files_without_stats, report.slices_read)
    return kept, report


def _names(slc: FileSlice) -> list[str]:
    names = [slc.base_file.name] if slc.base_file is not None else []
    return names + [log.name for log in slc.log_files]
