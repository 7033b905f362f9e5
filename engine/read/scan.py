"""A planned read: the file slices to read and how to read each one, apart.

Every read of the engine is a :class:`Scan`: the driver (or the caller of
:meth:`engine.table.Table.read`) plans it once — the visible instants, the slices that data
skipping keeps, the record keys the filter pins — and each slice is then read on its own by
:meth:`SliceScan.read`, the same code whether the slices are read by threads of this process
(:meth:`Scan.to_table`, what ``Table.read`` returns) or one per Spark task in executors
(``ingest/spark_read.py``). Concatenating the slices' tables gives the read's rows.

Picklable: a :class:`SliceScan` carries the storage location, the table config, the instants
the read sees (the active timeline only, no listing, no open file) and the read's spec;
nothing in it refers to driver state, so an executor on another machine reads a slice from
the slice and the :class:`SliceScan` alone. Reading a slice twice (a retried task) gives the
same rows: the slice names its files, and the files of a completed instant never change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import TidelakeError
from engine.layout.file_group import FileSlice, Visibility
from engine.read.skipping import Pruning
from engine.read.slice_reader import SliceReader, dictionary_meta
from engine.schema import COMMIT_TIME, META_FIELDS, META_SCHEMA, RECORD_KEY
from engine.storage import Storage
from engine.timeline.active import Timeline


def read_schema(schema: pa.Schema | None, populate_meta_fields: bool = True,
                columns: Sequence[str] | None = None) -> pa.Schema:
    """The columns a read of a table with this ``schema`` returns and their types, as the
    schema declares them (meta fields as plain strings; only the meta fields while the table
    records no schema; none of them for a table that stores no meta values)."""
    result = schema if schema is not None else META_SCHEMA
    if not populate_meta_fields:
        result = pa.schema([f for f in result if f.name not in META_FIELDS])
    if columns is not None:
        result = pa.schema([result.field(c) for c in columns if c in result.names])
    return result


@dataclass
class SliceScan:
    """How to read one slice of a planned read (picklable; see the module doc).

    ``read_columns`` are the columns read from the files (None: all), ``expr`` the row
    filter applied to the merged rows, ``keys`` the record keys the filter pins (the read
    of each file is restricted to them), ``commit_times`` the requested times of the
    commits an incremental read returns (None: any), ``columns`` the columns returned.
    """

    storage: Storage
    timeline: Timeline
    visible: Visibility
    schema: pa.Schema | None
    read_columns: list[str] | None = None
    read_optimized: bool = False
    expr: pc.Expression | None = None
    keys: pa.Array | None = None
    commit_times: tuple[str, ...] | None = None
    columns: list[str] | None = None
    use_threads: bool = True
    as_of: str | None = None
    """The instant whose view the read needs whole (a time travel's, a snapshot's latest
    commit), or None for an incremental read from :attr:`start`: what a file found gone is
    judged against (:func:`~engine.read.retention.missing_file_error`)."""
    start: str | None = None
    """An incremental read's start (None: not one, or from the first commit on)."""
    _reader: SliceReader | None = field(default=None, repr=False, compare=False)

    @property
    def populate_meta_fields(self) -> bool:
        """False for tables that store no meta column values (their reads drop them)."""
        return self.timeline.config.populate_meta_fields

    def output_schema(self) -> pa.Schema:
        """The columns a read returns and their types (:func:`read_schema`)."""
        return read_schema(self.schema, self.populate_meta_fields, self.columns)

    def slice_reader(self) -> SliceReader:
        """The engine's reader of slices under this scan's instants (made once)."""
        if self._reader is None:
            self._reader = SliceReader(self.storage, self.timeline, self.visible, self.schema,
                                       use_threads=self.use_threads)
        return self._reader

    def read(self, slc: FileSlice) -> pa.Table:
        """The rows ``slc`` contributes to the read: merged, filtered, commit range applied,
        columns selected (a column the slice's files lack is left out: the caller conforms
        or concatenates). A file of the slice that is gone (the cleaner ran since the plan)
        raises :class:`~engine.errors.InstantNotReadableError` or
        :class:`~engine.errors.CorruptTableError` (:meth:`missing`), never the storage's
        ``FileNotFoundError`` — what an executor reading one slice can tell; a whole read
        plans again first (:meth:`Scan.to_table`)."""
        try:
            return self.read_files(slc)
        except FileNotFoundError as exc:
            raise self.missing(exc) from None

    def missing(self, exc: FileNotFoundError) -> TidelakeError:
        """The table's error for a planned file found gone (``exc``), judged on the timeline
        as it is now (:func:`~engine.read.retention.missing_file_error`)."""
        from engine.read.retention import missing_file_error

        # Storage raises FileNotFoundError(path); pyarrow's file systems an errno and a text
        path = exc.filename or (exc.args[0] if len(exc.args) == 1 else str(exc))
        return missing_file_error(self.storage, self.timeline.config, str(path),
                                  as_of=self.as_of, start=self.start)

    def read_files(self, slc: FileSlice) -> pa.Table:
        """:meth:`read` letting ``FileNotFoundError`` through (for :meth:`Scan.to_table`,
        which plans again)."""
        part = self.slice_reader().read_slice(slc, read_optimized=self.read_optimized,
                                              columns=self.slice_columns(slc), keys=self.keys)
        if not part.num_rows:
            return part
        part = dictionary_meta(part)
        if not self.populate_meta_fields:
            # Meta columns hold no values in such tables; Hudi readers leave them out.
            part = part.drop_columns([c for c in META_FIELDS if c in part.column_names])
        if self.expr is not None:
            part = part.filter(self.expr)
        if self.commit_times is not None and part.num_rows:
            part = part.filter(pc.is_in(part.column(COMMIT_TIME),
                                        value_set=pa.array(self.commit_times, pa.string())))
        if self.columns is not None:
            part = part.select([c for c in self.columns if c in part.column_names])
        return part

    def slice_columns(self, slc: FileSlice) -> list[str] | None:
        """The columns read from ``slc``'s files: :attr:`read_columns`, but for a slice read
        without a merge (a base file alone, or read-optimized) only those the read returns
        or filters on — the meta columns and the ordering field are a merge's, and a
        one-column read of a base file on an object store then fetches that column's chunks
        and not the file (:class:`~engine.storage.RangedInput`)."""
        if self.read_columns is None or self.columns is None \
                or (slc.log_files and not self.read_optimized):
            return self.read_columns
        keep = set(self.columns)
        if self.keys is not None:
            keep.add(RECORD_KEY)  # the base file is read by key
        if self.commit_times is not None:
            keep.add(COMMIT_TIME)
        # the filter's columns as planning found them (:meth:`TableReader._read_columns`)
        named = str(self.expr) if self.expr is not None else ""
        return [c for c in self.read_columns if c in keep or (named and c in named)]

    def __getstate__(self) -> dict[str, Any]:
        """A lean copy: the timeline's instants without its caches, no reader."""
        state = dict(self.__dict__)
        lean = Timeline(self.storage, self.timeline.config, self.timeline.instants)
        visible = Visibility(lean, self.visible.active, as_of=self.visible.as_of,
                             end_completion=self.visible.end_completion)
        visible.used_archived = self.visible.used_archived
        state["timeline"], state["visible"], state["_reader"] = lean, visible, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


@dataclass
class Scan:
    """A planned read: :attr:`slices` to read with :attr:`slice_scan`, and what data skipping
    pruned (:attr:`pruning`, :meth:`engine.table.Table.explain`)."""

    slice_scan: SliceScan
    slices: list[FileSlice]
    pruning: Pruning = field(default_factory=Pruning)
    requested_columns: Sequence[str] | None = None
    """The caller's column list (None: all), checked against the result by :meth:`to_table`."""
    replan: Callable[[], Scan] | None = field(default=None, repr=False, compare=False)
    """Plans this read again on the timeline as it is then (set by
    :meth:`engine.table.Table.scan` / :meth:`~engine.table.Table.scan_incremental`):
    :meth:`to_table` calls it once when a planned file is gone."""

    def output_schema(self) -> pa.Schema:
        """The schema of the read's rows (:meth:`SliceScan.output_schema`)."""
        return self.slice_scan.output_schema()

    def to_table(self, threads: int = 1) -> pa.Table:
        """Read every slice (``threads`` at a time) and concatenate: the read's rows.

        A planned file found gone (the cleaner ran since the plan, or a compaction's clean
        took the slice the plan holds) makes the read plan itself again once, on the
        timeline reloaded (:attr:`replan`), and read that plan; a file gone again, or gone
        from a scan without :attr:`replan`, raises
        :class:`~engine.errors.InstantNotReadableError` (the read's instant is outside what
        the cleaner keeps now) or :class:`~engine.errors.CorruptTableError` (a file the
        cleaner keeps is missing): :func:`engine.read.retention.missing_file_error`."""
        try:
            return self._read_all(threads)
        except FileNotFoundError as exc:
            if self.replan is None:
                raise self.slice_scan.missing(exc) from None
        again = self.replan()  # InstantNotReadableError if the cleaner passed the read's instant
        try:
            return again._read_all(threads)
        except FileNotFoundError as exc:
            raise again.slice_scan.missing(exc) from None

    def _read_all(self, threads: int) -> pa.Table:
        scan = self.slice_scan
        scan.use_threads = threads <= 1 or len(self.slices) <= 1
        scan._reader = None
        if threads > 1 and len(self.slices) > 1:
            # Parquet decoding and Arrow kernels release the GIL: a slice per core at a time.
            with ThreadPoolExecutor(max_workers=min(threads, len(self.slices))) as pool:
                parts = list(pool.map(scan.read_files, self.slices))
        else:
            parts = [scan.read_files(s) for s in self.slices]
        tables = [p for p in parts if p.num_rows]
        if tables:
            result = pa.concat_tables(tables, promote_options="permissive")
        else:
            result = scan.schema.empty_table() if scan.schema is not None \
                else pa.schema([]).empty_table()
            if not scan.populate_meta_fields:
                result = result.drop_columns([c for c in META_FIELDS
                                              if c in result.column_names])
        wanted = self.requested_columns
        if wanted is not None:
            missing = [c for c in wanted if c not in result.column_names]
            if missing and result.num_columns:
                raise ValueError(f"columns: no column {missing[0]!r} in the table")
            result = result.select([c for c in wanted if c in result.column_names])
        return result


__all__ = ["Scan", "SliceScan", "read_schema"]
