"""A read run as distributed tasks: what a Spark read source (``ingest/spark_read.py``) calls.

The driver parses Hudi's read options (:class:`ReadOptions`), plans the read
(:meth:`engine.table.Table.plan_read`: a :class:`Scan` of the slices to read) and, for a
stream, asks where the table's commits end (:func:`latest_completion`) and whether the
commits of a micro-batch kept a schema its stream can carry (:func:`check_stream_schema`);
each executor task reads one :class:`FileSlice` with the plan's picklable
:class:`SliceScan` — the code ``Table.read`` runs. The change feed's rows have
:data:`CDC_SCHEMA`. A Spark condition that restates the read's filters takes their values
as the reader compares them (:func:`filters_as_columns`). The types are the engine's own
(:mod:`engine.read.scan`, :mod:`engine.read.options`), named here because this surface
hands them out.
"""

from __future__ import annotations

from engine.config import TableConfig
from engine.layout.file_group import FileSlice
from engine.read.changes import CDC_SCHEMA
from engine.read.options import (
    CDC,
    COLUMNS_KEY,
    EARLIEST,
    LATEST,
    READ_KEYS,
    QueryType,
    ReadOptions,
    check_columns,
    missing_column,
)
from engine.read.reader import filters_as_columns
from engine.read.scan import Scan, SliceScan
from engine.read.stream_schema import check_stream_schema
from engine.storage import Storage
from engine.timeline.active import Timeline, completion_key

__all__ = ["CDC", "CDC_SCHEMA", "COLUMNS_KEY", "EARLIEST", "LATEST", "READ_KEYS", "FileSlice",
           "QueryType", "ReadOptions", "Scan", "SliceScan", "check_columns",
           "check_stream_schema", "filters_as_columns", "latest_completion", "missing_column"]


def latest_completion(storage: Storage, config: TableConfig) -> str | None:
    """Where the table's completed data commits end now: the completion key of the latest
    (completion time on table version 8, else requested time), None before the first. A
    stream's offsets are these keys. Driver side."""
    done = Timeline.load(storage, config).completed_data_instants
    return completion_key(done[-1]) if done else None
