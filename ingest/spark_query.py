"""Spark queries that prune: :func:`read_table` and :func:`register_table`.

``spark.read.format("tidelake")`` (:mod:`ingest.spark_read`) prunes by the columns and
filters given with the read (a schema, ``tidelake.read.columns``, ``tidelake.read.filters``)
and reads every kept slice in Python workers; Spark 4.3's Python data source has no column
pruning, and its filter pushdown reuses a plan across queries (docs/spark-read.md).
:func:`read_table` plans the read on the driver with the engine too —
:meth:`engine.table.Table.scan` with the caller's ``columns`` and ``filters`` (partition
pruning, data skipping by the metadata table's partition and column statistics, the record
index for key lookups: the engine decides, nothing here restates it) — and splits the
planned slices in two:

- **base files read as stored** — a slice that is a base file alone (every slice after a
  compaction, every slice of a copy-on-write table and of a read-optimized query) whose
  Parquet columns have the table's types — are read by Spark's own Parquet scan over the
  exact file list the engine kept (:func:`_native_frame`): Spark prunes columns, pushes
  filters into row groups, and reads in the JVM. The engine's row filter is applied there
  as a Spark condition (:func:`spark_condition`), with the same null and NaN rules;
- **the other slices** (base file and logs merged by key, a file of an older schema, an
  incremental query's commit range, a store Spark has no file system for) are read by the
  engine in executors, one task per slice (:func:`_engine_frame`): the same executor code
  as the data source (:func:`ingest.spark_read.read_slice_batches`).

The two are unioned by name into one DataFrame with the columns and types of the data
source. A DataFrame from :func:`read_table` is the table as planned at the call: call it
again to see later commits.

Who runs what: planning, the footer check of the native files and the union run on the
driver (the caller's process); the engine's slice reads run in executors' Python workers
(the :class:`~engine.read.distributed.SliceScan` travels inside the task's function, with
the store's options: never printed, as in the data source); Spark's Parquet scan runs in
the executors' JVMs.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import InvalidOptionError
from engine.read.distributed import (
    FileSlice,
    QueryType,
    ReadOptions,
    Scan,
    SliceScan,
    filters_as_columns,
)
from engine.storage import Storage, is_storage_option
from engine.table import Table
from ingest.ddl import spark_schema
from ingest.spark_read import SlicePartition, read_slice_batches, target_schema

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["read_table", "register_table", "spark_condition"]

Filters = Any
"""The engine's filters (``Table.read``'s): DNF terms, or a pyarrow expression (read through
the engine alone: it has no exact Spark form here)."""


def read_table(spark: SparkSession, path: str, *, columns: Sequence[str] | None = None,
               filters: Filters = None, options: Mapping[str, str] | None = None,
               native: bool = True) -> DataFrame:
    """A tidelake (Hudi) table as a Spark DataFrame, pruned by the engine.

    ``columns`` (None: Hudi's meta fields and every column) and ``filters`` (the engine's
    DNF filters, ``[("city", "=", "oslo"), ("fare", ">", 10)]``, as ``Table.read`` takes
    them) plan the read with :meth:`engine.table.Table.scan`: the partitions and files its
    pruning skips are never opened, and the rows returned are exactly ``Table.read(columns,
    filters, ...)``'s. ``options`` are the data source's: Hudi's read options
    (``hoodie.datasource.query.type`` ``snapshot`` / ``read_optimized`` / ``incremental``,
    ``as.of.instant``, the begin and end instant times) and the object store's (``aws_*``,
    ``google_*``, ``azure_*``). The change feed (``...incremental.format=cdc``) is the data
    source's alone.

    ``native`` (default): base files are read by Spark's Parquet scan where that returns
    exactly the engine's rows (module doc); False reads every slice through the engine.
    Driver side; the table is planned now, once.
    """
    storage_options = {str(k).lower(): str(v) for k, v in (options or {}).items()
                       if is_storage_option(str(k))}
    read = ReadOptions.from_options(options or {}, ignore=tuple(storage_options))
    if read.cdc:
        raise InvalidOptionError("hoodie.datasource.query.incremental.format",
                                 "the change feed is read by spark.read.format('tidelake')")
    table = Table.open(path, storage_options=storage_options)
    cols = list(columns) if columns is not None else None
    if read.query_type is QueryType.INCREMENTAL:
        scan = table.scan_incremental(read.begin_instant, read.end_instant, cols, filters,
                                      start_inclusive=True)
    else:
        scan = table.scan(cols, filters, read.as_of_instant,
                          read_optimized=read.query_type is QueryType.READ_OPTIMIZED)
    return _frame(spark, scan, filters,
                  native=native and read.query_type is not QueryType.INCREMENTAL)


def register_table(spark: SparkSession, name: str, path: str, *,
                   columns: Sequence[str] | None = None, filters: Filters = None,
                   options: Mapping[str, str] | None = None, native: bool = True) -> DataFrame:
    """:func:`read_table` as the temporary view ``name`` (``spark.sql("SELECT ... FROM
    name")``); returns the DataFrame. The view is pruned by the engine with ``columns`` and
    ``filters`` given here, as planned now; a ``WHERE`` clause of a query on the view is
    Spark's: pushed into the Parquet scan of the base files (row groups whose statistics
    rule it out are skipped), applied to the rows of the engine-read slices."""
    frame = read_table(spark, path, columns=columns, filters=filters, options=options,
                       native=native)
    frame.createOrReplaceTempView(name)
    return frame


# -- the plan, split -----------------------------------------------------------------------


def _frame(spark: SparkSession, scan: Scan, filters: Filters, *, native: bool) -> DataFrame:
    output = spark_schema(scan.output_schema())
    slice_scan = scan.slice_scan
    condition = None
    if native and slice_scan.storage.is_local and slice_scan.schema is not None:
        condition = spark_condition(filters, spark_schema(slice_scan.schema))
    stored, merged = [], []
    for slc in scan.slices:
        if condition is not None and _read_as_stored(slice_scan, slc):
            stored.append(slc)
        else:
            merged.append(slc)
    frames = []
    if stored:
        assert condition is not None
        frames.append(_native_frame(spark, slice_scan, stored, condition, output))
    if merged or not frames:
        frames.append(_engine_frame(spark, slice_scan, merged, output))
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


_SAFE_PATH = re.compile(r"[\w.\-/=+@,~% ]+")
"""Characters a local path may hold to be handed to Spark as is: no glob characters (Spark
expands ``*?[]{}``), no ``:`` (Hadoop's ``Path`` reads a scheme before it). ``%`` is taken
literally (Hudi's encoded partition values: ``east%2Fwest``)."""


def _read_as_stored(scan: SliceScan, slc: FileSlice) -> bool:
    """Whether the engine's read of ``slc`` returns its base file's rows as stored: a base
    file alone (or a read-optimized read), Parquet, every column the file has read by Spark
    as the table's type (:func:`_spark_form`; a type the table widened since is cast by the
    engine), and a path Spark takes literally. Then Spark's Parquet scan of the file
    (columns the file lacks: null) gives the same rows."""
    base = slc.base_file
    if base is None or (slc.log_files and not scan.read_optimized) \
            or scan.commit_times is not None or not base.name.endswith(".parquet"):
        return False
    full = scan.storage.full(base.path)
    if not _SAFE_PATH.fullmatch(full) or any(
            part.startswith((".", "_")) for part in base.path.split("/")):
        return False  # Spark skips hidden files; Hadoop parses some characters
    assert scan.schema is not None
    stored = _file_schema(scan.storage, base.path)
    for field in scan.schema:
        if field.name not in stored.names:
            continue  # a column added since: null in both reads
        have = stored.field(field.name).type
        if pa.types.is_dictionary(have):  # Arrow's own schema in the footer: values stored
            have = have.value_type
        if not _spark_reads_as_is(have) or _spark_form(have) != _spark_form(field.type):
            return False
    return True


def _spark_form(kind: pa.DataType) -> str | None:
    """The Spark type an Arrow type reads as (``bigint``, ``array<struct<a:int>>``): the
    same for a file's column and the table's when Spark's scan gives the engine's values —
    list element names (Java's ``array``, pyarrow's ``element``) and nullability aside, and
    ``ms`` timestamps read as ``us`` (exact); None for a type Spark has no form of."""
    from pyspark.sql.pandas.types import from_arrow_type

    try:
        return str(from_arrow_type(kind).simpleString())
    except (TypeError, ValueError, NotImplementedError):
        return None


def _spark_reads_as_is(kind: pa.DataType) -> bool:
    """Whether Spark's Parquet reader gives the values of an Arrow type exactly as the
    engine does (after the data source's conversion to Spark's types)."""
    if pa.types.is_struct(kind):
        return all(_spark_reads_as_is(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _spark_reads_as_is(kind.value_type)
    if pa.types.is_map(kind):
        return _spark_reads_as_is(kind.key_type) and _spark_reads_as_is(kind.item_type)
    if pa.types.is_timestamp(kind):
        return kind.unit in ("ms", "us")
    return (pa.types.is_boolean(kind) or pa.types.is_signed_integer(kind)
            or kind in (pa.float32(), pa.float64(), pa.string(), pa.large_string(),
                        pa.binary(), pa.large_binary(), pa.date32())
            or pa.types.is_decimal128(kind))


_SCHEMAS: OrderedDict[tuple[str, str], pa.Schema] = OrderedDict()
_SCHEMAS_KEPT = 4096


def _file_schema(storage: Storage, rel: str) -> pa.Schema:
    """The Arrow schema of a base file's footer (a completed file never changes: kept for
    the process's later queries, the last :data:`_SCHEMAS_KEPT` files)."""
    key = (storage.full(""), rel)
    schema = _SCHEMAS.get(key)
    if schema is None:
        with storage.open_input(rel, whole=False) as source:
            schema = pq.read_schema(source)
        _SCHEMAS[key] = schema
        if len(_SCHEMAS) > _SCHEMAS_KEPT:
            _SCHEMAS.popitem(last=False)
    return schema


def _native_frame(spark: SparkSession, scan: SliceScan, slices: list[FileSlice],
                  condition: Column | bool, output: StructType) -> DataFrame:
    """Spark's Parquet scan of the slices' base files, the engine's filter applied, in the
    columns of ``output``."""
    from pyspark.sql import functions as F

    assert scan.schema is not None
    files = [scan.storage.full(s.base_file.path) for s in slices if s.base_file is not None]
    frame = spark.read.schema(spark_schema(scan.schema)).parquet(*files)
    if not isinstance(condition, bool):
        frame = frame.where(condition)
    return frame.select(*[F.col(_quoted(f.name)) for f in output.fields])


def _engine_frame(spark: SparkSession, scan: SliceScan, slices: list[FileSlice],
                  output: StructType) -> DataFrame:
    """The slices read by the engine in executors, one Spark task per slice."""
    target = target_schema(output)
    partitions = [SlicePartition(scan, slc) for slc in slices]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_slice_batches(partitions[index], target)

    count = len(partitions)
    return spark.range(count, numPartitions=max(count, 1)).mapInArrow(read, output)


# -- the engine's filters as a Spark condition ---------------------------------------------


def spark_condition(filters: Filters, schema: StructType) -> Column | bool | None:
    """The engine's DNF ``filters`` as a Spark condition keeping the same rows as the
    engine's (pyarrow's) filter; True for no filter, None when a term has no exact Spark
    form (an expression, an unknown column, a value of another type, NaN): the caller then
    reads through the engine.

    Where pyarrow and Spark differ, the condition follows pyarrow: ``not in`` keeps nulls
    (pyarrow's ``is_in`` is false for a null, not null), and a NaN never satisfies ``<``,
    ``<=``, ``>``, ``>=`` (Spark orders NaN above every number). Timestamp and decimal values
    are first put in the column's kind by the engine's rule for filter values
    (:func:`engine.read.distributed.filters_as_columns`): a zone-less ``datetime`` compared with a
    column of instants is that UTC wall-clock time, an aware one with a zone-less column its
    UTC wall-clock time; a ``Decimal`` the column cannot hold (more digits after the point,
    beyond its precision or Spark's 38 digits) is compared exactly through one it can."""
    if filters is None or (isinstance(filters, Sequence) and not filters):
        return True
    if not isinstance(filters, Sequence) or isinstance(filters, str):
        return None
    dnf = [filters] if isinstance(filters[0], tuple) else list(filters)
    kinds = {f.name: f.dataType for f in schema.fields}
    result: Column | None = None
    for conj in dnf:
        if not isinstance(conj, Sequence) or not conj:
            return None
        both: Column | None = None
        for term in conj:
            column = _term(term, kinds)
            if column is None:
                return None
            both = column if both is None else both & column
        assert both is not None
        result = both if result is None else result | both
    return result


_ORDERING = {"<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__"}


def _term(term: Any, kinds: Mapping[str, Any]) -> Column | None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    if not (isinstance(term, tuple) and len(term) == 3 and isinstance(term[0], str)):
        return None
    name, op, value = term
    kind = kinds.get(name)
    if kind is None or "`" in name:
        return None
    arrow_kind = _arrow_kind(kind)
    if arrow_kind is not None:  # the engine's values for the column (one rule: the reader's)
        rewritten = filters_as_columns([[(name, op, value)]], pa.schema([(name, arrow_kind)]))
        assert isinstance(rewritten, list)
        (name, op, value), = rewritten[0]
    column = F.col(_quoted(name))
    if op in ("in", "not in"):
        if not isinstance(value, list | tuple | set):
            return None
        if not value:  # pyarrow's is_in of nothing: false for every row, null ones too
            return F.lit(op == "not in")
        literals = [_literal(v, kind) for v in value]
        if any(lit is None for lit in literals):
            return None
        found = column.isin(*literals)
        return found if op == "in" else (~found | column.isNull())
    literal = _literal(value, kind)
    if literal is None:
        return None
    if op in ("=", "=="):
        return column == literal
    if op == "!=":
        return column != literal
    if op in _ORDERING:
        compared: Column = getattr(column, _ORDERING[op])(literal)
        if isinstance(kind, DoubleType | FloatType):
            compared = compared & ~F.isnan(column)
        return compared
    return None


def _literal(value: Any, kind: Any) -> Column | None:
    """``value`` as a Spark literal of the column type ``kind``'s family, or None if the
    engine would compare it otherwise (or not at all)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(kind, T.StringType):
        return F.lit(value) if isinstance(value, str) else None
    if isinstance(kind, T.BooleanType):
        return F.lit(value) if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if isinstance(kind, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        if isinstance(value, int) and -2**63 <= value < 2**63:
            return F.lit(value)
        return None
    if isinstance(kind, T.FloatType | T.DoubleType):
        if isinstance(value, int) and abs(value) < 2**53:
            return F.lit(float(value))
        return F.lit(value) if isinstance(value, float) and not math.isnan(value) else None
    if isinstance(kind, T.DecimalType):
        if isinstance(value, int) and not isinstance(value, bool):
            value = decimal.Decimal(value)
        return F.lit(value) if isinstance(value, decimal.Decimal) and value.is_finite() \
            else None
    if isinstance(kind, T.DateType):
        return F.lit(value) if type(value) is dt.date else None
    if isinstance(kind, T.TimestampType | T.TimestampNTZType) \
            and isinstance(value, dt.datetime):  # in the column's kind already (_term)
        if isinstance(kind, T.TimestampType) and value.tzinfo is not None:
            utc = value.astimezone(dt.timezone.utc)
            return F.lit(utc.strftime("%Y-%m-%d %H:%M:%S.%f+00:00")).cast("timestamp")
        if isinstance(kind, T.TimestampNTZType) and value.tzinfo is None:
            return F.lit(value.strftime("%Y-%m-%d %H:%M:%S.%f")).cast("timestamp_ntz")
    return None


def _arrow_kind(kind: Any) -> pa.DataType | None:
    """The Arrow type whose filter values the reader rewrites
    (:func:`engine.read.distributed.filters_as_columns`) for a Spark column type: a decimal's (at
    its scale), a timestamp's (instants in UTC, or zone-less); None for the others."""
    from pyspark.sql import types as T

    if isinstance(kind, T.DecimalType):
        return pa.decimal128(kind.precision, kind.scale)
    if isinstance(kind, T.TimestampType):
        return pa.timestamp("us", tz="UTC")
    if isinstance(kind, T.TimestampNTZType):
        return pa.timestamp("us")
    return None


def _quoted(name: str) -> str:
    return f"`{name}`"
