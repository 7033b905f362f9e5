"""Read options under Hudi's names (``hoodie.datasource.query.type``, ``as.of.instant``, ...).

Declared once here, with parser, default and doc (:func:`engine.config.option`); the Spark
source (``spark.read.format("tidelake")``, :mod:`ingest.spark_read`) parses its options with
:meth:`ReadOptions.from_options` and docs/configuration.md lists them (a test keeps the two
the same). Keys are case-insensitive, as Spark's options are; an unknown key or a malformed
value raises :class:`~engine.errors.InvalidOptionError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

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
        if parsed.as_of_instant is not None and parsed.query_type is not QueryType.SNAPSHOT:
            raise InvalidOptionError("as.of.instant", "applies to the snapshot query only "
                                     f"(the query type is {parsed.query_type.value})")
        return parsed


READ_KEYS: tuple[ConfigKey[Any], ...] = tuple(
    replace(f.metadata["option"], attr=f.name) for f in fields(ReadOptions)
    if "option" in f.metadata)
"""Every read option, in declaration order."""
_KEY_OF = {spec.attr: spec.key for spec in READ_KEYS}

__all__ = ["CDC", "EARLIEST", "LATEST", "LATEST_STATE", "READ_GROUP", "READ_KEYS", "QueryType",
           "ReadOptions"]
