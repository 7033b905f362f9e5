"""Spark reads of tidelake (Hudi) tables: ``spark.read.format("tidelake").load(path)`` and
``spark.readStream.format("tidelake").load(path)``.

A Python data source (Spark's ``pyspark.sql.datasource`` API), registered by
:func:`register`. It decides nothing about the table: the engine plans every read
(:meth:`engine.table.Table.scan` / :meth:`~engine.table.Table.scan_incremental`: the
visible instants, the file slices — listed through the metadata table where the table has
one — and the incremental commit range, whose slices no commit of the range wrote are left
out) and reads each slice (:meth:`engine.read.scan.SliceScan.read`: base file and log
blocks merged by the table's merge mode). So a Spark read returns
exactly what ``Table.read`` / ``Table.read_incremental`` return.

Who runs what:

- the driver side (Spark's planning Python worker; for streams one long-lived Python
  process per query): option parsing, ``schema``, ``partitions`` — one
  :class:`SlicePartition` per file slice — and the stream's offsets;
- executors: :meth:`TidelakeReader.read` / :meth:`TidelakeStreamReader.read`, one task per
  slice, reading it through the engine and yielding Arrow record batches in the Spark schema.

Everything a task needs travels in its :class:`SlicePartition` (the slice and the engine's
picklable :class:`~engine.read.scan.SliceScan`); nothing relies on driver state, so it runs
unchanged on a cluster.

Options are Hudi's (:class:`engine.read.options.ReadOptions`, docs/configuration.md "Read
options"), and the object store's (keys beginning ``aws_``, ``google_``, ``azure_``:
:func:`engine.storage.is_storage_option`), which apply to this read only, over the store's
environment; they reach executors inside each partition's :class:`~engine.read.scan.SliceScan`
(its storage) and are never shown: no ``repr`` prints them, and :func:`register` adds
:mod:`engine.redact`'s markers to the session's ``spark.sql.redaction.options.regex``.

Columns and filters are the read's, said before the query: Spark 4.3's Python data source
API has no column pruning (Spark asks for no column list), and its filter pushdown
(``DataSourceReader.pushFilters``) returns wrong rows: Spark keeps the read planned by the
first pushdown on a DataFrame's relation and reuses it for a later query on the same
DataFrame (or temp view) whose filters it does not push — ``df.where("region = 'north'")
.count()`` then ``df.count()`` counts the north rows only (Spark's
``PythonDataSourceV2.getOrCreateReadInfo`` after a ``pushFilters`` that passed no filter).
So a batch read takes them as the engine does, fixed for the DataFrame: the columns of a
schema the user gives (``.schema("uuid string, fare double")``: Spark then does not call
:meth:`TidelakeDataSource.schema` and hands that schema to ``reader``; any subset of the
table's columns, in any order, with the table's types), or of the option
``tidelake.read.columns``, and the filters of ``tidelake.read.filters`` (JSON of the
engine's terms): :meth:`engine.table.Table.plan_read` plans with them (partition pruning,
data skipping by the metadata table, the record index), and each task reads only those
columns of its slice (plus what a merge needs), on object stores only their column chunks.
Spark's own ``WHERE`` and ``SELECT`` still apply to the rows after the scan. The other
pruned Spark read is :func:`ingest.spark_query.read_table` (Spark's Parquet reader reads
the base files the engine keeps). A DataFrame reads the table as it was at its first
action (Spark reuses the planned slices): ``load`` again to see later commits.

Streams: offsets are ``{"completion_time": t}``, the completion time of the latest completed
instant a micro-batch covers (``"0"``: before the first commit). A micro-batch (start, end] is
the engine's incremental read of the commits completed in that range: each record written by
them once, in its latest version as of ``end``. Spark keeps the offsets in the query's
checkpoint; a restarted query continues after the last committed batch, and a replayed batch
plans exactly the same slices and rows (planning depends on the two offsets only: no commit
can complete at or before a completion time already seen).

The change feed (``hoodie.datasource.query.incremental.format=cdc``, incremental queries and
streams): Hudi's CDC columns ``op``/``ts_ms``/``before``/``after``, computed by the engine
(:meth:`engine.table.Table.read_changes`) in one executor task per range
(:class:`ChangePartition`), since it compares keys across file groups; unlike the latest-state
read, it carries deletes.

A stream keeps the schema Spark asked for when the query started. A micro-batch whose commits
changed the table's schema in a way that schema cannot carry (a column added, a type widened,
a column dropped or renamed) fails while it is planned, before a row is read, with
:class:`~engine.errors.SchemaChangedError` naming the commit
(:func:`engine.read.stream_schema.check_stream_schema`); a restarted query reads the new
schema and replays the batch from its checkpoint, so nothing is dropped silently. A stream
of chosen columns (a schema the user gave, or ``tidelake.read.columns``) reads only them,
and a column added outside them loses it nothing: it goes on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from engine.errors import InvalidOptionError
from engine.read.distributed import (
    CDC,
    CDC_SCHEMA,
    COLUMNS_KEY,
    EARLIEST,
    LATEST,
    READ_KEYS,
    FileSlice,
    ReadOptions,
    Scan,
    SliceScan,
    check_columns,
    check_stream_schema,
    latest_completion,
    missing_column,
)
from engine.redact import redact, spark_redaction_regex
from engine.schema import conform
from engine.storage import is_storage_option
from engine.table import Table
from ingest.ddl import spark_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "BEFORE_FIRST_COMMIT",
    "SOURCE_NAME",
    "SlicePartition",
    "TidelakeDataSource",
    "TidelakeReader",
    "TidelakeStreamReader",
    "check_given_schema",
    "read_slice_batches",
    "register",
    "target_schema",
]

SOURCE_NAME = "tidelake"
BEFORE_FIRST_COMMIT = "0"
"""The stream offset before the table's first commit (completion times sort after it)."""
STREAM_REFUSED = ("hoodie.datasource.query.type", "as.of.instant",
                  "hoodie.datasource.read.begin.instanttime",
                  "hoodie.datasource.read.end.instanttime", "tidelake.read.filters")
"""Batch-only options: a stream is always the incremental read from its offsets on, of
every row."""
CDC_OPTION = "hoodie.datasource.query.incremental.format"


def register(spark: SparkSession) -> None:
    """Make ``format("tidelake")`` available in ``spark`` (batch and streaming reads); once
    per session, before the first read. The executors' Python must import this module
    (tidelake installed there, or on their ``PYTHONPATH``): Spark unpickles the source there
    by module name."""
    spark.dataSource.register(TidelakeDataSource)
    _extend_redaction(spark)


_REDACTION_CONF = "spark.sql.redaction.options.regex"


def _extend_redaction(spark: SparkSession) -> None:
    """Append :mod:`engine.redact`'s markers to the session's option redaction (Spark hides
    ``secret|password|token`` by default; ``aws_access_key_id`` and other ``key`` options
    too, then), so the store's credentials never show in a plan string (as
    :func:`ingest.kafka_source.register` does for the Kafka source's)."""
    pattern = spark_redaction_regex().removeprefix("(?i)")
    current = spark.conf.get(_REDACTION_CONF) or "(?i)url"
    if pattern not in current:
        prefix = "" if current.startswith("(?i)") else "(?i)"
        spark.conf.set(_REDACTION_CONF, f"{prefix}{current}|{pattern}")


# -- options and schema ----------------------------------------------------------------------


def _path(options: Mapping[str, Any]) -> str:
    path = next((str(v) for k, v in options.items() if str(k).lower() == "path"), "")
    if not path:
        raise InvalidOptionError("path", "required: spark.read.format('tidelake').load(path)")
    return path


def check_given_schema(given: StructType, table: pa.Schema) -> None:
    """Raise :class:`ValueError` naming the first column of a schema the user gave to a
    read (``.schema(...)``) that the table lacks, or that holds another type there than
    the table's as Spark reads it (:func:`ingest.ddl.spark_schema`); nullability aside."""
    spark_types = {f.name: f.dataType for f in spark_schema(table).fields}
    for wanted in given.fields:
        have = spark_types.get(wanted.name)
        if have is None:
            raise ValueError(f"schema: {missing_column(wanted.name, table)}")
        if have.simpleString() != wanted.dataType.simpleString():
            whole = (" (a struct, list or map column is read whole: give its type as the "
                     "table has it)" if have.typeName() in ("struct", "array", "map") else "")
            raise ValueError(f"schema: column {wanted.name!r} is {have.simpleString()} in the "
                             f"table, not {wanted.dataType.simpleString()}{whole}")


def target_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects of the batches a read yields (as its worker makes it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _as_spark_reads(schema: pa.Schema) -> pa.Schema:
    """A table schema as the Arrow schema of the batches a read in it yields."""
    return target_schema(spark_schema(schema))


# -- reading slices --------------------------------------------------------------------------


class SlicePartition(InputPartition):
    """One Spark input partition: a file slice and how to read it (picklable)."""

    def __init__(self, scan: SliceScan, slc: FileSlice) -> None:
        super().__init__(f"{slc.partition_path}/{slc.file_id}@{slc.base_instant}")
        self.scan = scan
        self.slice = slc


def _partitions(scan: Scan) -> list[SlicePartition]:
    return [SlicePartition(scan.slice_scan, slc) for slc in scan.slices]


class ChangePartition(InputPartition):
    """The change feed of the commits completed in (``start``, ``end``] (``[`` with
    ``inclusive``) as one Spark input partition (picklable: the table's location and store
    options, the range; the engine reads it in the executor,
    :meth:`engine.table.Table.read_changes`). One task per range: the feed compares each
    commit's file groups before and after it, by key across groups."""

    def __init__(self, path: str, storage_options: Mapping[str, str], start: str | None,
                 end: str, inclusive: bool) -> None:
        super().__init__(f"changes ({start}, {end}]")
        self.path = path
        self.storage_options = dict(storage_options)
        self.start = start
        self.end = end
        self.inclusive = inclusive

    def __repr__(self) -> str:
        return f"ChangePartition({self.path!r}, {self.start!r}, {self.end!r})"

    def read(self) -> pa.Table:
        """Executor: the range's change rows."""
        table = Table.open(self.path, storage_options=self.storage_options)
        return table.read_changes(self.start, self.end, start_inclusive=self.inclusive)


def read_slice_batches(partition: InputPartition, target: pa.Schema
                       ) -> Iterator[pa.RecordBatch]:
    """Executor side: the slice's (or change range's) rows through the engine, as batches
    of ``target`` (the data source's tasks, and :func:`ingest.spark_query.read_table`'s)."""
    if isinstance(partition, ChangePartition):
        rows = partition.read()
    elif isinstance(partition, SlicePartition):
        rows = partition.scan.read(partition.slice)
    else:  # Spark's placeholder for "no slices"
        return
    if rows.num_rows:
        yield from conform(rows, target).combine_chunks().to_batches()


def _latest_completion(table: Table) -> str:
    """The completion key of the table's latest completed data instant (or
    :data:`BEFORE_FIRST_COMMIT`)."""
    return latest_completion(table.storage, table.config) or BEFORE_FIRST_COMMIT


class TidelakeReader(DataSourceReader):
    """Batch reads: snapshot, read-optimized, time travel and incremental queries, of the
    columns ``options.columns`` names (None: all) with its filters; ``schema_given``: the
    schema is the user's (its columns are ``options.columns``, checked against the table's
    when planned)."""

    def __init__(self, path: str, options: ReadOptions, schema: StructType,
                 storage_options: Mapping[str, str] | None = None, *,
                 schema_given: bool = False) -> None:
        self.path = path
        self.options = options
        self.schema = schema
        self.schema_given = schema_given
        self._storage_options = dict(storage_options or {})

    def __repr__(self) -> str:
        return f"TidelakeReader({self.path!r})"

    def plan(self) -> Scan:
        """Driver: the engine's plan of this read (one slice per Spark partition), of the
        columns of :attr:`schema` when the user gave it (checked against the table's)."""
        table = Table.open(self.path, storage_options=self._storage_options)
        if self.schema_given:
            check_given_schema(self.schema, table.read_schema())
        return table.plan_read(self.options)

    def partitions(self) -> Sequence[InputPartition]:
        """Driver: one partition per file slice the engine plans to read (the change feed:
        one partition of the range, its end fixed now so a retried task reads the same)."""
        if self.options.cdc:
            begin = self.options.begin_instant
            end = self.options.end_instant or _latest_completion(self._table())
            return [ChangePartition(self.path, self._storage_options, begin, end, True)]
        return _partitions(self.plan())

    def _table(self) -> Table:
        return Table.open(self.path, storage_options=self._storage_options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor: one slice's rows."""
        return read_slice_batches(partition, target_schema(self.schema))


class TidelakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reads: each micro-batch is the incremental read of the commits completed in
    (start offset, end offset], of the columns ``options.columns`` names (None: all;
    ``schema_given``: a schema the user gave, checked against the table's)."""

    def __init__(self, path: str, options: ReadOptions, schema: StructType,
                 storage_options: Mapping[str, str] | None = None, *,
                 schema_given: bool = False) -> None:
        self.path = path
        self.options = options
        self.schema = schema
        self.schema_given = schema_given
        self._storage_options = dict(storage_options or {})
        self._available_now: str | None = None

    def __repr__(self) -> str:
        return f"TidelakeStreamReader({self.path!r})"

    def _table(self) -> Table:
        return Table.open(self.path, storage_options=self._storage_options)

    def _latest(self) -> str:
        return _latest_completion(self._table())

    def initialOffset(self) -> dict[str, Any]:
        """Driver: where a new query starts (``hoodie.datasource.streaming.startOffset``)."""
        start = self.options.start_offset
        if start == EARLIEST:
            return {"completion_time": BEFORE_FIRST_COMMIT}
        if start == LATEST:
            return {"completion_time": self._latest()}
        return {"completion_time": start}

    def getDefaultReadLimit(self) -> ReadLimit:
        """Every commit completed since the last batch."""
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Driver: ``trigger(availableNow=True)`` reads up to the commits completed now."""
        self._available_now = self._latest()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Driver: the latest completion time (never before ``start``)."""
        latest = self._latest()
        if self._available_now is not None:
            latest = min(latest, self._available_now)
        return {"completion_time": max(latest, str(start["completion_time"]))}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Driver: one partition per slice holding records of the commits in (start, end]."""
        begin, until = str(start["completion_time"]), str(end["completion_time"])
        if until <= begin:
            return []
        since = None if begin == BEFORE_FIRST_COMMIT else begin
        if self.options.cdc:  # the feed's columns never change: no schema check
            return [ChangePartition(self.path, self._storage_options, since, until, False)]
        table = self._table()
        columns = self.options.columns
        if self.schema_given:
            check_given_schema(self.schema, table.read_schema())
        scan = table.scan_incremental(since, until, columns)
        # A commit of the range that changed the schema fails the batch (before any row is
        # read), naming it: a restarted query reads the new schema and replays this batch.
        # A stream of chosen columns loses nothing to a column added outside them.
        check_stream_schema(scan.slice_scan.timeline, since, until,
                            target_schema(self.schema), _as_spark_reads,
                            chosen=columns is not None)
        return _partitions(scan)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor: one slice's rows of the micro-batch."""
        return read_slice_batches(partition, target_schema(self.schema))


class TidelakeDataSource(DataSource):
    """``format("tidelake")``: a Hudi table written by tidelake (or any Hudi 1.x / 0.14+
    writer the engine reads) at the path given to ``load``."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return SOURCE_NAME

    def _columns_option(self) -> tuple[str, ...] | None:
        """``tidelake.read.columns`` parsed alone (the other options: :meth:`_options`)."""
        spec = next(s for s in READ_KEYS if s.key == COLUMNS_KEY)
        for key, value in self.options.items():
            if str(key).lower() == COLUMNS_KEY:
                columns: tuple[str, ...] = spec.parse(COLUMNS_KEY, str(value))
                return columns
        return None

    def _options(self, *, streaming: bool) -> ReadOptions:
        if streaming:
            for key in STREAM_REFUSED:
                if any(str(k).lower() == key.lower() for k in self.options):
                    raise InvalidOptionError(
                        key, "applies to batch reads only: a stream reads the commits "
                        "completed after its offset (hoodie.datasource.streaming.startOffset)")
        storage = [str(k) for k in self.options if is_storage_option(k)]
        return ReadOptions.from_options(self.options, ignore=("path", *storage),
                                        streaming=streaming)

    def _storage_options(self) -> dict[str, str]:
        """The object store's options (``aws_*``, ``google_*``, ``azure_*``: the keys
        :class:`engine.storage.Storage` takes), over the store's environment."""
        return {str(k).lower(): str(v) for k, v in self.options.items()
                if is_storage_option(k)}

    def __repr__(self) -> str:
        return f"TidelakeDataSource({redact(dict(self.options))!r})"

    def schema(self) -> StructType:
        """Driver: the table's columns, Hudi's meta fields first (as ``Table.read``), or
        those ``tidelake.read.columns`` names, in its order. Spark calls it only when the
        user gave no schema (``.schema(...)``); the instance it then hands to
        :meth:`reader` is the one this ran on, so :attr:`_inferred` tells the two apart."""
        self._inferred = True
        if any(str(k).lower() == CDC_OPTION and str(v).strip().lower() == CDC
               for k, v in self.options.items()):
            return spark_schema(CDC_SCHEMA)
        columns = self._columns_option()  # checked now: a column the table lacks fails load()
        table = Table.open(_path(self.options), storage_options=self._storage_options())
        schema = table.read_schema()
        if columns is not None:
            check_columns(columns, schema)
            schema = pa.schema([schema.field(c) for c in columns])
        return spark_schema(schema)

    def _read_options(self, schema: StructType, *, streaming: bool) -> tuple[ReadOptions, bool]:
        """The read's options, and whether ``schema`` is one the user gave (Spark called no
        :meth:`schema`): then the read is of its columns — those of
        ``tidelake.read.columns`` too, if given."""
        options = self._options(streaming=streaming)
        if getattr(self, "_inferred", False) or options.cdc:
            return options, False
        names = tuple(schema.fieldNames())
        if options.columns is not None and options.columns != names:
            raise InvalidOptionError(
                COLUMNS_KEY, f"names {', '.join(options.columns)} but the schema given names "
                f"{', '.join(names)}: give one of the two")
        return replace(options, columns=names), True

    def reader(self, schema: StructType) -> TidelakeReader:
        """Driver: a batch reader of ``schema``'s columns."""
        options, given = self._read_options(schema, streaming=False)
        return TidelakeReader(_path(self.options), options, schema, self._storage_options(),
                              schema_given=given)

    def streamReader(self, schema: StructType) -> TidelakeStreamReader:
        """Driver: a stream reader of ``schema``'s columns."""
        options, given = self._read_options(schema, streaming=True)
        return TidelakeStreamReader(_path(self.options), options, schema,
                                    self._storage_options(), schema_given=given)
