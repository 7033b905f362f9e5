"""What a :class:`~ingest.sink.HudiStreamingSink` is built from: one frozen :class:`SinkConfig`.

Each argument of the sink is a field here, declared once with its default and doc; the checks
that need no table run when the config is built (a bad value is a ``ValueError`` naming the
field). The ``tidelake ingest`` job builds it from its settings (:mod:`jobs.job_config`, whose
defaults for these settings are the defaults here). No Spark needed to import this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from engine.config import WriteConfig
from engine.errors import UnsupportedStorageError
from engine.storage import normalize_location

if TYPE_CHECKING:
    from ingest.decode import Decoder

__all__ = [
    "BUCKET",
    "DEFAULT_IDENTIFIER",
    "DEFAULT_MAX_ERROR_FRACTION",
    "DEFAULT_SHARDS",
    "ERROR_GUARD_MIN_RECORDS",
    "GLOBAL_STATE",
    "MAX_SHARDS",
    "RECORD_INDEX",
    "SinkConfig",
    "field_docs",
    "sink_default",
]

BUCKET = "BUCKET"
GLOBAL_STATE = "GLOBAL_STATE"
RECORD_INDEX = "RECORD_INDEX"
RECORD_UPDATE_PARTITION_PATH = "hoodie.record.index.update.partition.path"
INDEXES = (BUCKET, GLOBAL_STATE, RECORD_INDEX)
DEFAULT_IDENTIFIER = "default_single_writer"
"""Default of Hudi's ``hoodie.datasource.write.streaming.checkpoint.identifier``."""
DEFAULT_SHARDS = 32
"""Default number of key shards of the GLOBAL_STATE index's state."""
MAX_SHARDS = 4096
DEFAULT_MAX_ERROR_FRACTION = 0.5
"""Default ``max_error_fraction``: a batch with more bad records than good ones fails."""
ERROR_GUARD_MIN_RECORDS = 10
"""Batches with fewer records are not judged by ``max_error_fraction`` (their bad records go to
the error table): one bad record in a quiet topic must not stop the job."""


@dataclass(frozen=True)
class SinkConfig:
    """The sink's arguments, checked once (driver side; the sink copies what tasks need into
    picklable specs)."""

    table_path: str
    """The table's folder, ``file://`` URI or object store URI (``s3://``, ``gs://``,
    ``az://``, ``abfs[s]://``); opened, or created from the decoder's schema with the first
    batch that has a valid record."""
    decoder: Decoder
    """Turns Kafka values into rows (:mod:`ingest.decode`)."""
    record_key: str | Sequence[str] | None = None
    """Record key field(s); required to create the table, checked against an existing one."""
    precombine: str | None = None
    """Ordering (precombine) field."""
    partition_by: str | Sequence[str] | None = None
    """Partition field(s)."""
    table_name: str | None = None
    """Table name when creating (default: from the folder name)."""
    table_type: str = "MERGE_ON_READ"
    """MERGE_ON_READ or COPY_ON_WRITE, when creating."""
    index: str = BUCKET
    """``"BUCKET"`` (partition-level: the key's hash picks its file group; the table uses the
    bucket layout) or ``"GLOBAL_STATE"`` (key → location in the streaming query's RocksDB
    state; needs :func:`~ingest.sink.start_ingest` or
    :meth:`~ingest.sink.HudiStreamingSink.streaming_frame`) or ``"RECORD_INDEX"`` (global:
    key → location in the metadata table's ``record_index`` partition, looked up per batch in
    the groups the keys hash to; :mod:`ingest.record_index`; needs ``hoodie.metadata.enable``,
    on by default)."""
    num_buckets: int = WriteConfig.num_buckets
    """Buckets per partition of a table the sink creates (``hoodie.bucket.index.num.buckets``,
    whose default it shares)."""
    options: Mapping[str, Any] | None = None
    """Writer options of the table (docs/configuration.md)."""
    error_table_path: str | None = None
    """Where bad records go; without one, a batch with a bad record fails naming it (the
    ``tidelake ingest`` job's default: ``<table.path>_errors``)."""
    storage_options: Mapping[str, str] | None = field(default=None, repr=False)
    """The object store's options for ``table_path`` and ``error_table_path`` (object_store
    keys: ``aws_endpoint_url``, ``aws_region``, ...; over the store's environment). They
    travel to the write tasks inside the table's storage and are never shown."""
    error_table_partitioned: bool = True
    """Whether a new error table is partitioned by ``error_date`` (:mod:`ingest.error_table`)."""
    delete_column: str | None = "_hoodie_is_deleted"
    """A boolean column marking deletes (ignored when the decoder has no such column); Kafka
    tombstones delete the key they carry."""
    update_partition_path: bool | None = None
    """GLOBAL_STATE and RECORD_INDEX: an update whose partition value changed moves the record
    (True: its old copy is deleted) or updates it where the table stores it (False: Hudi's
    ``update.partition.path`` false). RECORD_INDEX: the table option
    ``hoodie.record.index.update.partition.path`` (set here or in ``options``, not both ways);
    None: that option's value, else True (tidelake's default for every global index)."""
    checkpoint_identifier: str = DEFAULT_IDENTIFIER
    """Hudi's streaming writer identifier; every job writing the same table needs its own."""
    write_parallelism: int | None = None
    """Write tasks per batch (default: ``spark.sql.shuffle.partitions``)."""
    state_shards: int = DEFAULT_SHARDS
    """GLOBAL_STATE: how many shards the keys are hashed into (the state operator is entered
    once per shard and batch; :mod:`ingest.state_index`); fixed for a checkpoint."""
    conflict_retries: int = 10
    """How often a batch refused because a concurrent writer's commit touched the same file
    groups is replanned and written again before the query fails; the same budget bounds the
    retries of a batch whose start or commit waited for the table lock longer than
    ``hoodie.write.lock.wait_time_ms`` (a table service holding it)."""
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION
    """0 to 1: a batch of at least 10 records (:data:`ERROR_GUARD_MIN_RECORDS`) with a larger
    share of bad records fails with :class:`~ingest.sink.TooManyBadRecordsError` (naming the
    most common reason) and commits nothing, neither to the table nor to the error table; 1
    turns the check off."""
    key_format: str = "string"
    """How a tombstone's Kafka key gives its record key: ``"string"`` (the key, as UTF-8, is
    the record key string — on a table with several key fields the engine's
    ``field:value,...`` form), ``"json"`` (a JSON object holding the record key fields, and
    optionally the partition fields) or ``"avro"`` (an Avro record written with
    ``key_schema``). A Kafka key that cannot be mapped sends the tombstone to the error table
    with the reason."""
    key_schema: Any = None
    """``"json"``: a DDL string or ``.avsc`` (default: the table's key and partition fields);
    ``"avro"``: an ``.avsc`` path, JSON text or dict (required)."""
    services: bool = True
    """Run the table services inside the job (:mod:`ingest.services`: compaction, clustering,
    cleaning, archival as the table options say); False leaves them to another process
    (``tidelake table compact|clean|...``)."""

    def __post_init__(self) -> None:
        for name in ("table_path", "error_table_path"):
            location = getattr(self, name)
            if location is not None:
                try:
                    normalize_location(location)
                except UnsupportedStorageError as exc:
                    raise UnsupportedStorageError(f"{name}: {exc}") from None
        index = str(self.index).upper()
        if index not in INDEXES:
            raise ValueError(f"index: expected {', '.join(INDEXES)}, got {self.index!r}")
        object.__setattr__(self, "index", index)
        self._resolve_update_partition_path(index)
        shards = self.state_shards
        if isinstance(shards, bool) or not isinstance(shards, int) \
                or not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"state_shards: expected an integer from 1 to {MAX_SHARDS}, got "
                             f"{shards!r}")
        if not self.checkpoint_identifier:
            raise ValueError("checkpoint_identifier: must not be empty")
        if self.conflict_retries < 0:
            raise ValueError(f"conflict_retries: must not be negative, got "
                             f"{self.conflict_retries}")
        if self.write_parallelism is not None and self.write_parallelism <= 0:
            raise ValueError(f"write_parallelism: must be positive, got "
                             f"{self.write_parallelism}")
        fraction = self.max_error_fraction
        if isinstance(fraction, bool) or not (
                isinstance(fraction, int | float) and 0 <= fraction <= 1):
            raise ValueError(f"max_error_fraction: expected a number from 0 to 1, got "
                             f"{fraction!r}")
        object.__setattr__(self, "max_error_fraction", float(fraction))


    def _resolve_update_partition_path(self, index: str) -> None:
        """Fill :attr:`update_partition_path`; RECORD_INDEX: the engine's option decides (its
        tagging is the engine's, :mod:`ingest.record_index`), so the field and ``options`` are
        made to say the same."""
        given = self.update_partition_path
        if given is not None and not isinstance(given, bool):
            raise ValueError(f"update_partition_path: expected True, False or None, got "
                             f"{given!r}")
        if index != RECORD_INDEX:
            object.__setattr__(self, "update_partition_path", True if given is None else given)
            return
        options = dict(self.options or {})
        stored = None
        if RECORD_UPDATE_PARTITION_PATH in options:
            stored = WriteConfig.from_options(
                {RECORD_UPDATE_PARTITION_PATH: options[RECORD_UPDATE_PARTITION_PATH]}
            ).record_update_partition_path
        if given is not None and stored is not None and given != stored:
            raise ValueError(f"update_partition_path: {given} contradicts "
                             f"options[{RECORD_UPDATE_PARTITION_PATH!r}] = "
                             f"{options[RECORD_UPDATE_PARTITION_PATH]!r}; set one of them")
        value = given if given is not None else stored if stored is not None \
            else WriteConfig.record_update_partition_path
        options[RECORD_UPDATE_PARTITION_PATH] = str(value).lower()
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "update_partition_path", value)


def sink_default(name: str) -> Any:
    """The default of the :class:`SinkConfig` field ``name`` (job settings take it from here)."""
    for f in fields(SinkConfig):
        if f.name == name:
            if f.default is MISSING:
                raise ValueError(f"SinkConfig.{name} has no default")
            return f.default
    raise ValueError(f"SinkConfig has no field {name!r}")


def field_docs() -> dict[str, str]:
    """Each :class:`SinkConfig` field's docstring (read from this module's source, as Sphinx
    reads attribute docstrings), for docs/configuration.md."""
    import ast
    import inspect
    import sys

    tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SinkConfig")
    docs: dict[str, str] = {}
    for before, after in zip(cls.body, cls.body[1:], strict=False):
        if (isinstance(before, ast.AnnAssign) and isinstance(before.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)):
            docs[before.target.id] = " ".join(str(after.value.value).split())
    return docs
