"""What one file group's share of a commit is: a :class:`WriteTask` (create a base file,
merge into it, append a log file) and the :class:`WriteContext` every task of the commit
shares, as plain picklable values. :mod:`engine.write.write_handle` executes them; the MDT
partitions that compute a file's entries (:mod:`engine.metadata.record_index`) read them, so
the values stand apart from the handle that imports those partitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine.config import LogBlockFormat, MergeMode
from engine.format.bloom import BloomSizing
from engine.storage import Storage
from engine.timeline.version import EIGHT, TableVersion

CREATE = "create"
MERGE = "merge"
APPEND = "append"


@dataclass(frozen=True)
class WriteContext:
    """Everything a handle needs besides its records; picklable, same for all tasks."""

    storage: Storage
    instant_time: str
    table_name: str
    data_schema: pa.Schema  # data columns only, storage types
    avro_schema_with_meta: dict[str, Any]
    merge_mode: MergeMode
    ordering_field: str | None
    ordering_avro_type: str | None
    """Ordering kind of the ordering field in delete blocks (``delete_block.ordering_kind``)."""
    log_block_format: LogBlockFormat = LogBlockFormat.PARQUET
    compression: str = "snappy"
    write_bloom_filter: bool = True
    bloom_sizing: BloomSizing = field(default_factory=BloomSizing)
    timeline_folder: str | None = None
    """Where a task checks, after publishing, that its instant was not rolled back (None:
    no check, for handles run outside an instant's lifecycle, and for tasks the committing
    writer runs in its own process and waits for: its check under the lock before the
    commit point covers them, :meth:`~engine.write.write_client.WriteClient.execute_local`)."""
    metadata_partitions: tuple[str, ...] = ()
    """The metadata table's index partitions the table keeps (declared when the instant
    began): a handle puts what its file adds to them in its stat's ``metadata``."""
    column_stats_columns: tuple[str, ...] = ()
    """Columns whose stats a handle records for its file (empty: the table keeps no
    ``column_stats``)."""
    table_version: TableVersion = EIGHT
    """The table's version: how a log file is named (:func:`~engine.format.naming.new_log_file`)."""
    markers: bool = False
    """Each handle records its data file in the instant's markers before creating it
    (:mod:`engine.layout.markers`), so the commit finds files of failed task attempts
    without listing the partitions: the write client's tasks that run elsewhere (Spark
    executors). Off for tasks the committing writer runs once each in its own process."""


@dataclass(frozen=True)
class WriteTask:
    """One file group's share of a commit.

    ``records`` holds data columns plus ``_hoodie_record_key`` and
    ``_hoodie_partition_path``; ``deletes`` holds those two plus the ordering field when
    known. ``base_file``/``base_instant``/``log_files`` describe the slice written on
    (merge/append): its base file's relative path, its base instant, and the names of its
    log files (Hudi records them in an append's write stat).
    """

    kind: str
    partition_path: str
    file_id: str
    records: pa.Table | None
    deletes: pa.Table | None
    base_file: str | None = None  # relative path of the current base file
    base_instant: str | None = None
    task_partition: int = 0
    stage: int = 0
    attempt: int = 0
    num_updates: int = 0
    log_files: tuple[str, ...] = ()
    located_keys: pa.Array | None = None
    """The keys of ``records`` an index located in this group (updates in place), when the
    planner tagged every record (an upsert by key lookup: the write client's plan, or the
    streaming job's record-index tasks through
    :meth:`~engine.write.group_writer.GroupWriter.write`); None when not known. An append of
    records alone then keeps the record_index without reading the slice: the other keys
    enter the group."""
    partition_exists: bool = False
    """The view holds committed files in the partition, so its
    ``.hoodie_partition_metadata`` exists (every handle writes it before its data file): the
    handle does not look for it (one ``HEAD`` per task on an object store)."""

    @property
    def write_token(self) -> str:
        """Hudi write token of this attempt."""
        return f"{self.task_partition}-{self.stage}-{self.attempt}"
