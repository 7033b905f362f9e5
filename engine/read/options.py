"""Read options under Hudi's names (``hoodie.datasource.query.type``, ``as.of.instant``, ...).

Declared once here, with parser, default and doc (:func:`engine.config.option`); the Spark
source (``spark.read.format("tidelake")``, :mod:`ingest.spark_read`) parses its options with
:meth:`ReadOptions.from_options` and docs/configuration.md lists them (a test keeps the two
the same). Keys are case-insensitive, as Spark's options are; an unknown key or a malformed
value raises :class:`~engine.errors.InvalidOptionError` naming it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

import pyarrow as pa

from engine.config import ConfigKey, option
from engine.errors import InvalidOptionError
from engine.timeline.instant import parse_instant_time

READ_GROUP = "read"
"""The docs table (:func:`engine.config.describe_options`) of the read options."""


class QueryType(str, Enum):
    """``hoodie.datasource.query.type``: which view of the table a read returns."""

    SNAPSHOT = "snapshot"
    READ_OPTIMIZED = "read_optimized"
    INCREMENTAL = "incremental"


EARLIEST = "earliest"
LATEST = "latest"
LATEST_STATE = "latest_state"
CDC = "cdc"


def _incremental_format(key: str, raw: str) -> str:
    wanted = str(raw).strip().lower()
    if wanted not in (LATEST_STATE, CDC):
        raise InvalidOptionError(key, f"expected {LATEST_STATE} or {CDC}, got {raw!r}")
    return wanted


def _query_type(key: str, raw: str) -> QueryType:
    wanted = str(raw).strip().lower()
    for member in QueryType:
        if wanted == member.value:
            return member
    raise InvalidOptionError(key, f"expected one of {', '.join(m.value for m in QueryType)}, "
                             f"got {raw!r}")


def _instant(key: str, raw: str) -> str:
    text = str(raw).strip()
    try:
        parse_instant_time(text)
    except ValueError:
        raise InvalidOptionError(key, f"expected an instant time yyyyMMddHHmmss[SSS], got "
                                 f"{raw!r}") from None
    return text


def _start_offset(key: str, raw: str) -> str:
    text = str(raw).strip()
    if text.lower() in (EARLIEST, LATEST):
        return text.lower()
    try:
        return _instant(key, text)
    except InvalidOptionError:
        raise InvalidOptionError(key, f"expected earliest, latest or a completion time "
                                 f"yyyyMMddHHmmss[SSS], got {raw!r}") from None


COLUMNS_KEY = "tidelake.read.columns"
FILTERS_KEY = "tidelake.read.filters"
FILTER_OPS = ("=", "==", "!=", "<", "<=", ">", ">=", "in", "not in")
"""The engine's filter operators (``Table.read``'s DNF terms)."""

Term = tuple[str, str, Any]
"""One filter term ``(column, op, value)``."""


def _columns(key: str, raw: str) -> tuple[str, ...]:
    names = [name.strip() for name in str(raw).split(",")]
    if not any(names):
        raise InvalidOptionError(key, f"expected column names separated by commas, got {raw!r}")
    if not all(names):
        raise InvalidOptionError(key, f"an empty column name in {raw!r}")
    twice = [name for i, name in enumerate(names) if name in names[:i]]
    if twice:
        raise InvalidOptionError(key, f"column {twice[0]!r} given twice")
    return tuple(names)


_SCALAR = (str, int, float, bool)


def _term(key: str, item: Any) -> Term:
    if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
            and isinstance(item[1], str)):
        raise InvalidOptionError(key, f"a term is [column, op, value], got {json.dumps(item)}")
    name, op, value = item[0], item[1].strip().lower(), item[2]
    if op not in FILTER_OPS:
        raise InvalidOptionError(key, f"unknown operator {item[1]!r} in the term on {name!r}; "
                                 f"expected one of {', '.join(FILTER_OPS)}")
    if op in ("in", "not in"):
        if not isinstance(value, list) or not value \
                or not all(isinstance(v, _SCALAR) for v in value):
            raise InvalidOptionError(key, f"{op!r} on {name!r} takes a non-empty list of "
                                     f"values (no null), got {json.dumps(value)}")
        return name, op, tuple(value)
    if not isinstance(value, _SCALAR):
        raise InvalidOptionError(key, f"{op!r} on {name!r} takes a string, number or boolean "
                                 f"(null matches no row), got {json.dumps(value)}")
    return name, op, value


def _filters(key: str, raw: str) -> tuple[tuple[Term, ...], ...]:
    """JSON of the engine's DNF filters: a list of ``[column, op, value]`` terms (their
    AND), or a list of such lists (an OR of ANDs)."""
    try:
        parsed = json.loads(str(raw))
    except ValueError as exc:
        raise InvalidOptionError(key, f"not JSON ({exc}): {raw!r}") from None
    if not isinstance(parsed, list) or not parsed:
        raise InvalidOptionError(key, "expected a non-empty JSON list of [column, op, value] "
                                 f"terms, or a list of such lists (an OR), got {raw!r}")
    if all(isinstance(item, list) and item and isinstance(item[0], list) for item in parsed):
        return tuple(tuple(_term(key, t) for t in conj) for conj in parsed)
    return (tuple(_term(key, t) for t in parsed),)


def _typed_value(name: str, value: Any, kind: pa.DataType) -> Any:
    """A JSON filter value as the engine compares it with a column of type ``kind``, or
    a ValueError saying why it cannot be."""
    def refused() -> ValueError:
        return ValueError(f"column {name!r} is {kind}: {json.dumps(value)} is no value of it")

    if isinstance(kind, pa.DictionaryType):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if isinstance(value, str):
            return value
        raise refused()
    if pa.types.is_boolean(kind):
        if isinstance(value, bool):
            return value
        raise refused()
    if isinstance(value, bool):
        raise refused()
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        if isinstance(value, int | float):
            return value
        raise refused()
    if pa.types.is_timestamp(kind):
        return _time_value(name, value, kind)
    try:
        if pa.types.is_decimal(kind) and isinstance(value, int | float | str):
            number = decimal.Decimal(str(value))
            if number.is_finite():
                return number
        elif pa.types.is_date(kind) and isinstance(value, str):
            return dt.date.fromisoformat(value)
        elif (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)) \
                and isinstance(value, str):
            return value.encode()
    except (ValueError, decimal.InvalidOperation):
        pass
    if pa.types.is_date(kind):
        raise ValueError(f"column {name!r} holds dates: give an ISO date (\"2024-03-01\"), "
                         f"got {json.dumps(value)}")
    raise refused()


def _time_value(name: str, value: Any, kind: pa.DataType) -> dt.datetime:
    """A JSON value against a timestamp column: an ISO time string whose meaning is the same
    to Spark and to hudi-rs, else a ValueError naming the column and saying why.

    A column of instants (``tz`` set: Spark's ``TIMESTAMP``, Avro ``timestamp-micros``;
    every column tidelake writes) takes a time with its offset or ``Z``: a zone-less one
    means the session time zone to Spark and UTC to hudi-rs (Arrow's cast to the column's
    zone). A zone-less column (Spark's ``TIMESTAMP_NTZ``, ``local-timestamp-micros``)
    takes a zone-less time: Spark drops an offset, hudi-rs converts to UTC. An epoch number
    is seconds to Spark's cast (Spark 4 compares no number with a time) and the column's
    unit to Arrow: refused too."""
    instants = kind.tz is not None
    example = "\"2024-03-01T10:00:00Z\"" if instants else "\"2024-03-01T10:00:00\""
    what = ("instants (Spark's TIMESTAMP)" if instants
            else "zone-less times (Spark's TIMESTAMP_NTZ)")
    if not isinstance(value, str):
        raise ValueError(f"column {name!r} holds {what}: give an ISO time ({example}), got "
                         f"{json.dumps(value)}; an epoch number is ambiguous (Spark casts "
                         "seconds, Arrow the column's unit; Spark compares no number with a "
                         "time)")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"column {name!r} holds {what}: {json.dumps(value)} is no ISO time "
                         f"({example})") from None
    if instants and parsed.tzinfo is None:
        raise ValueError(f"column {name!r} holds {what}: {json.dumps(value)} has no zone, "
                         "which Spark reads in the session time zone and hudi-rs as UTC: "
                         f"give its offset or Z ({example})")
    if not instants and parsed.tzinfo is not None:
        raise ValueError(f"column {name!r} holds {what}: {json.dumps(value)} has a zone, "
                         "which Spark drops and hudi-rs converts to UTC: give the wall-clock "
                         f"time without it ({example})")
    return parsed


def typed_filters(filters: Sequence[Sequence[Term]], schema: pa.Schema,
                  key: str = FILTERS_KEY) -> list[list[Term]]:
    """The filters of :data:`FILTERS_KEY` (JSON values) as the engine's DNF filters on a
    table of ``schema`` (a read's columns): each value in its column's kind — an ISO date
    string against a date column, an ISO time string against a timestamp column, with its
    offset or ``Z`` against instants and without against a zone-less column
    (:func:`_time_value`: what Spark and hudi-rs would read differently is refused), a
    number or a string against a decimal one, a string as bytes against a binary one. A
    column the table lacks, or a value of another kind, raises
    :class:`~engine.errors.InvalidOptionError` naming ``key`` and the column."""
    check_columns([name for conj in filters for name, _, _ in conj], schema, key)
    result = []
    for conj in filters:
        terms = []
        for name, op, value in conj:
            kind = schema.field(name).type
            try:
                if isinstance(value, tuple):
                    typed: Any = [_typed_value(name, v, kind) for v in value]
                else:
                    typed = _typed_value(name, value, kind)
            except ValueError as exc:
                raise InvalidOptionError(key, str(exc)) from None
            terms.append((name, op, typed))
        result.append(terms)
    return result


def check_columns(columns: Sequence[str], schema: pa.Schema, key: str = COLUMNS_KEY) -> None:
    """Raise :class:`~engine.errors.InvalidOptionError` naming ``key`` for a column of
    ``columns`` that a read of ``schema``'s table does not return."""
    for name in columns:
        if name not in schema.names:
            raise InvalidOptionError(key, missing_column(name, schema))


def missing_column(name: str, schema: pa.Schema) -> str:
    """What to say of ``name``, a column a read asks for that ``schema``'s table lacks: its
    columns, and the column it may have meant — one that differs in case only (names are
    case-sensitive, as Hudi's schema and Arrow's are), or the struct column whose field
    ``name`` names (``meta.id``: a struct is read whole, its fields are not columns)."""
    hint = ""
    near = [n for n in schema.names if n.lower() == name.lower()]
    head = name.split(".", 1)[0]
    if near:
        hint = f" (names are case-sensitive: {near[0]!r})"
    elif "." in name and head in schema.names and pa.types.is_struct(schema.field(head).type):
        hint = (f" ({head!r} is a struct: it is read whole, its fields are not columns; read "
                f"{head!r} and select {name} from it)")
    return f"no column {name!r} in the table{hint}; its columns: {', '.join(schema.names)}"


@dataclass(frozen=True)
class ReadOptions:
    """Typed read options, each field declared once by :func:`~engine.config.option`."""

    query_type: QueryType = option(
        "hoodie.datasource.query.type", _query_type, QueryType.SNAPSHOT,
        "`snapshot`: the latest merged rows; `read_optimized`: base files only (merge-on-read "
        "tables: rows as of the last compaction); `incremental`: the latest version of each "
        "record written by the commits completed from "
        "`hoodie.datasource.read.begin.instanttime` to the end instant time.",
        group=READ_GROUP)
    as_of_instant: str | None = option(
        "as.of.instant", _instant, None,
        "Time travel: the snapshot as of this instant time (`yyyyMMddHHmmss[SSS]`); snapshot "
        "query only.", group=READ_GROUP)
    begin_instant: str | None = option(
        "hoodie.datasource.read.begin.instanttime", _instant, None,
        "Incremental query: commits that completed at or after this completion time "
        "(inclusive, as Hudi 1.x; `Table.read_incremental(start)` excludes `start`); required "
        "with `incremental`.", shown="required (incremental)", group=READ_GROUP)
    end_instant: str | None = option(
        "hoodie.datasource.read.end.instanttime", _instant, None,
        "Incremental query: commits that completed up to this completion time (inclusive); "
        "unset: up to the latest.", group=READ_GROUP)
    start_offset: str = option(
        "hoodie.datasource.streaming.startOffset", _start_offset, EARLIEST,
        "Streaming reads (`spark.readStream`): the first micro-batch's start: `earliest` (every "
        "commit), `latest` (commits completed after the query started) or a completion time "
        "(commits completed after it). A restarted query continues from its checkpoint.",
        group=READ_GROUP)
    incremental_format: str = option(
        "hoodie.datasource.query.incremental.format", _incremental_format, LATEST_STATE,
        "`latest_state`: an incremental query (and each micro-batch of a stream) returns the "
        "latest version of each record the commits wrote — deleted records are not returned; "
        "`cdc`: the change feed, as Hudi's CDC query: one row per record a commit inserted, "
        "updated or deleted, columns `op` (`i`/`u`/`d`), `ts_ms` (the commit's instant time), "
        "`before` and `after` (the data columns as JSON). Incremental queries and streams only; "
        "works on every table (Hudi needs `hoodie.table.cdc.enabled`).", group=READ_GROUP)
    columns: tuple[str, ...] | None = option(
        COLUMNS_KEY, _columns, None,
        "The columns to read, by name, separated by commas (`uuid,fare`): the read returns "
        "these, in this order, and reads only them (and what merging a slice with log files "
        "needs: the record key and the ordering field); as `Table.read(columns=...)`. Names "
        "are case-sensitive; a struct, list or map column is read whole (a struct's field, "
        "`meta.src`, is no column: select it in Spark after the read). Unset: every "
        "column, or those of a schema given to the reader (`.schema(...)`). Not with the "
        "change feed (its columns are fixed).", group=READ_GROUP)
    filters: tuple[tuple[Term, ...], ...] | None = option(
        FILTERS_KEY, _filters, None,
        "The engine's filters as JSON: a list of `[column, op, value]` terms, their AND "
        "(`[[\"city\", \"=\", \"oslo\"], [\"fare\", \">\", 10]]`), or a list of such lists, "
        "an OR of ANDs; `op` one of `=`, `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in` "
        "(`in` takes a list). As `Table.read(filters=...)`: partitions, files (the metadata "
        "table's statistics) and key lookups (the record index) are pruned with them, and "
        "only matching rows returned. Dates as ISO strings (`\"2024-05-01\"`); times as ISO "
        "strings with their offset or `Z` against timestamp columns "
        "(`\"2024-05-01T10:00:00+02:00\"`; Spark's TIMESTAMP, every column tidelake "
        "writes), without one against zone-less columns (TIMESTAMP_NTZ): a time that Spark "
        "and hudi-rs would read differently (a zone-less time against instants, an epoch "
        "number) is refused; decimals as numbers or strings. Not with the change feed.",
        group=READ_GROUP)

    @property
    def cdc(self) -> bool:
        """True for the change feed (``hoodie.datasource.query.incremental.format=cdc``)."""
        return self.incremental_format == CDC

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *,
                     ignore: tuple[str, ...] = ("path",), streaming: bool = False
                     ) -> ReadOptions:
        """Parse string options (keys case-insensitive); ``ignore`` lists keys the caller
        handles itself (Spark's ``path``). Checks the combination: incremental needs a begin
        time, ``as.of.instant`` only with a snapshot query, the instant times and the change
        feed only with an incremental one (``streaming``: a stream, always incremental)."""
        given: dict[str, tuple[str, str]] = {}
        for key, value in options.items():
            lowered = str(key).lower()
            if lowered in given:
                raise InvalidOptionError(key, "given twice (option keys are case-insensitive)")
            given[lowered] = (str(key), str(value))
        skip = {k.lower() for k in ignore}
        by_lower = {spec.key.lower(): spec for spec in READ_KEYS}
        values: dict[str, Any] = {}
        for lowered, (key, value) in given.items():
            if lowered in skip:
                continue
            spec = by_lower.get(lowered)
            if spec is None:
                raise InvalidOptionError(key, "unknown read option; supported: "
                                         + ", ".join(s.key for s in READ_KEYS))
            values[spec.attr] = spec.parse(spec.key, value)
        parsed = cls(**values)
        incremental = parsed.query_type is QueryType.INCREMENTAL
        if incremental and parsed.begin_instant is None:
            raise InvalidOptionError("hoodie.datasource.read.begin.instanttime",
                                     "is required with hoodie.datasource.query.type="
                                     "incremental")
        if not incremental:
            for attr in ("begin_instant", "end_instant"):
                if getattr(parsed, attr) is not None:
                    raise InvalidOptionError(
                        _KEY_OF[attr], "applies to hoodie.datasource.query.type=incremental "
                        f"only (the query type is {parsed.query_type.value})")
        if parsed.cdc and not incremental and not streaming:
            raise InvalidOptionError(
                "hoodie.datasource.query.incremental.format", "cdc applies to "
                "hoodie.datasource.query.type=incremental (and to streams) only (the query "
                f"type is {parsed.query_type.value})")
        if parsed.cdc:
            for attr in ("columns", "filters"):
                if getattr(parsed, attr) is not None:
                    raise InvalidOptionError(
                        _KEY_OF[attr], "does not apply to the change feed "
                        "(hoodie.datasource.query.incremental.format=cdc): its columns are "
                        "fixed")
        if parsed.as_of_instant is not None and parsed.query_type is not QueryType.SNAPSHOT:
            raise InvalidOptionError("as.of.instant", "applies to the snapshot query only "
                                     f"(the query type is {parsed.query_type.value})")
        return parsed


READ_KEYS: tuple[ConfigKey[Any], ...] = tuple(
    replace(f.metadata["option"], attr=f.name) for f in fields(ReadOptions)
    if "option" in f.metadata)
"""Every read option, in declaration order."""
_KEY_OF = {spec.attr: spec.key for spec in READ_KEYS}

__all__ = ["CDC", "COLUMNS_KEY", "EARLIEST", "FILTERS_KEY", "FILTER_OPS", "LATEST",
           "LATEST_STATE", "READ_GROUP", "READ_KEYS", "QueryType", "ReadOptions", "check_columns",
           "missing_column", "typed_filters"]
