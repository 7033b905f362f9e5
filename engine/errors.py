"""The one exception root of tidelake's engine, with condition-named subclasses.

The retry intent is in the type: a :class:`TransientError` may succeed if the same call
is made again (a concurrent writer, a storage hiccup); a :class:`TerminalError` will not,
and a job should stop and report it. Bad arguments to public calls raise ``ValueError``
(or its subclass :class:`InvalidOptionError` for configuration keys), naming the argument.
"""

from __future__ import annotations


class TidelakeError(Exception):
    """Root of every error tidelake raises on purpose."""


class TerminalError(TidelakeError):
    """Retrying the same operation will fail the same way."""


class TransientError(TidelakeError):
    """The operation may succeed if it is retried."""


class InvalidOptionError(TidelakeError, ValueError):
    """A configuration key is unknown or its value malformed; the message names the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"option '{key}': {message}")
        self.key = key


class InvalidRecordError(TerminalError, ValueError):
    """Input rows miss a record key or ordering value, or carry a value that cannot be stored."""


class SchemaEvolutionError(InvalidRecordError):
    """The input's schema is no evolution of the table's that Hudi allows on write (a column
    dropped or renamed, a type narrowed or changed, a new name that is no Avro name);
    ``column`` names the column."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(message)
        self.column = column


class SchemaChangedError(TerminalError):
    """The table's schema changed within the commits a running stream is about to read, in a
    way the schema the stream started with cannot carry (a column added, dropped or renamed,
    a type widened): its rows would lose values. Restarting the query reads the new schema
    (it continues from its checkpoint). ``instant`` is the commit that changed it,
    ``column`` the first column concerned."""

    def __init__(self, message: str, instant: str, column: str) -> None:
        super().__init__(message)
        self.instant = instant
        self.column = column


class TableNotFoundError(TerminalError):
    """No Hudi table at the given path (no ``.hoodie/hoodie.properties``)."""


class TableExistsError(TerminalError):
    """``Table.create`` was called on a path that already holds a table."""


class UnsupportedTableError(TerminalError):
    """The table uses a feature or version this engine does not read or write."""


class UnsupportedStorageError(TerminalError, ValueError):
    """A table location names storage this engine cannot write yet (e.g. ``s3://``)."""


class ConditionalWriteUnsupportedError(UnsupportedStorageError):
    """An object store accepted a conditional write (``If-None-Match: *``, ``If-Match``) and
    ignored it, or refused it as unsupported: on such a store two writers could both publish
    the same file and commits would be lost silently, so nothing is written there unless the
    single-writer opt-out (``tidelake.storage.allow.unsafe.single.writer``) is set; the
    message says what the probe found and names the opt-out."""


class CorruptTableError(TerminalError):
    """A file of the table cannot be parsed (timeline metadata, properties, a data file)."""


class CommitConflictError(TransientError):
    """Another writer published the same instant or touched the same file groups first."""


class InstantStateError(TerminalError):
    """A timeline transition was asked for from the wrong state (e.g. completing twice)."""


class WriteConflictError(CommitConflictError):
    """A concurrent writer committed to (or scheduled a service on) a file group this write
    touched, or rolled this write's instant back: the write was refused whole and its files
    removed. Planning and writing again from the new table state may succeed."""


class LockTimeoutError(TransientError):
    """The table lock was not acquired within ``hoodie.write.lock.wait_time_ms``."""


class ClockSkewError(TerminalError):
    """The table's timeline holds an instant too far ahead of this machine's clock."""


class InstantNotReadableError(TerminalError, ValueError):
    """A time-travel or incremental read reaches before the earliest instant the cleaner
    kept readable (its files may be gone); the message names the earliest readable instant."""

    def __init__(self, message: str, earliest: str) -> None:
        super().__init__(message)
        self.earliest = earliest


class StorageError(TransientError, OSError):
    """A storage operation failed (an object store answered with an error or not at all);
    the message names the operation and the location, never a credential."""


class FileChangedError(StorageError):
    """A file changed while it was being read in parts (an object store answered another
    version — ETag, generation — for a later range than for the first): nothing read from
    it is used; reading it again from the start reads one version."""
