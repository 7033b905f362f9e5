"""tidelake engine: write and read Apache Hudi tables (version 8) with pyarrow and fastavro.

``engine`` never imports pyspark. The public API is :class:`Table`; errors derive from
:class:`TidelakeError`. ``Table`` is re-exported lazily so that importing one engine
module (say ``engine.format.bloom`` inside a Spark task) does not import the whole engine.
"""

from typing import TYPE_CHECKING, Any

from engine.errors import (
    ClockSkewError,
    CommitConflictError,
    InstantNotReadableError,
    InvalidOptionError,
    InvalidRecordError,
    SchemaChangedError,
    SchemaEvolutionError,
    StorageError,
    TableExistsError,
    TableNotFoundError,
    TerminalError,
    TidelakeError,
    TransientError,
    UnsupportedStorageError,
    WriteConflictError,
)

if TYPE_CHECKING:
    from engine.table import Table, TimelineEntry


def __getattr__(name: str) -> Any:
    if name in ("Table", "TimelineEntry"):
        from engine import table

        return getattr(table, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    "ClockSkewError",
    "CommitConflictError",
    "InstantNotReadableError",
    "InvalidOptionError",
    "InvalidRecordError",
    "SchemaChangedError",
    "SchemaEvolutionError",
    "StorageError",
    "Table",
    "TableExistsError",
    "TableNotFoundError",
    "TerminalError",
    "TidelakeError",
    "TimelineEntry",
    "TransientError",
    "UnsupportedStorageError",
    "WriteConflictError",
]
