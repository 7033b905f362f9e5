"""A writer's concurrency mode, and what non-blocking writers may not keep.

Hudi allows ``NON_BLOCKING_CONCURRENCY_CONTROL`` only on MERGE_ON_READ tables written with the
simple bucket index (``HoodieWriteConfig.Builder.validate``: "Non-blocking concurrency control
requires the MOR table with simple bucket index"; consistent hashing is refused too). There
concurrent writers never refuse each other: each writes its own log files and readers merge
them by the ordering field, whichever commits first.

The ``record_index`` of the metadata table cannot be kept that way: each writer computes its
entries from its own snapshot (a delete removes a key's entry, a concurrent upsert that found
the key live writes none), so a key live after both commits can be left out of the index and a
key-filtered read misses it (issue 34). A non-blocking writer that would keep it is refused
before any instant is created: at open (its options ask for it, or the table keeps one and its
options keep the metadata table) and again under the lock at the start of each instant (another
writer built the index since). Java validates only the index type; refusing the record_index
partition goes further, on purpose.
"""

from __future__ import annotations

from engine.config import ConcurrencyMode, IndexType, TableConfig, WriteConfig
from engine.errors import InvalidOptionError
from engine.metadata.keys import RECORD_INDEX
from engine.metadata.table import declared_partitions, snapshot_declared
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.version import WRITE_TABLE_VERSION

MODE_KEY = "hoodie.write.concurrency.mode"
NBCC = ConcurrencyMode.NON_BLOCKING_CONCURRENCY_CONTROL


def concurrency_mode(config: TableConfig, write_config: WriteConfig,
                     storage: Storage | None = None) -> ConcurrencyMode:
    """The writer's concurrency mode: ``hoodie.write.concurrency.mode``, or by default
    non-blocking for MERGE_ON_READ tables with the BUCKET index and event-time ordering whose
    writer keeps no record index, and optimistic otherwise. Raises
    :class:`~engine.errors.InvalidOptionError` for non-blocking writers Hudi does not allow
    and for those that would keep the record index (``storage``: the table, to know whether
    it keeps one; None: judged by the options only).

    Non-blocking writers' commits may complete in another order than they started; Hudi
    orders their log files by completion time (as tidelake's reader does) while hudi-rs 0.5.0
    orders them by instant time, so the two read a different winner when the order decides:
    under commit-time ordering always, under event-time ordering only on equal ordering
    values. Hence the default only where the ordering field decides.
    """
    bucket_mor = (config.is_mor and write_config.index_type is IndexType.BUCKET
                  and not config.consistent_hashing)
    mode = write_config.concurrency_mode
    if not config.table_version.non_blocking_concurrency:
        if mode is NBCC:
            raise InvalidOptionError(
                MODE_KEY, f"NON_BLOCKING_CONCURRENCY_CONTROL needs table version 8; this table "
                f"is version {config.version} ({WRITE_TABLE_VERSION})")
        return mode or ConcurrencyMode.OPTIMISTIC_CONCURRENCY_CONTROL
    if mode is None:
        if bucket_mor and config.orders_by_event_time \
                and not _keeps_record_index(write_config, storage, metadata_default=False):
            return NBCC
        return ConcurrencyMode.OPTIMISTIC_CONCURRENCY_CONTROL
    if mode is NBCC and not bucket_mor:
        raise InvalidOptionError(
            MODE_KEY, "NON_BLOCKING_CONCURRENCY_CONTROL needs a MERGE_ON_READ table written "
            "with the BUCKET index (hoodie.index.type=BUCKET) and its SIMPLE engine, as Hudi")
    if mode is NBCC and _keeps_record_index(write_config, storage, metadata_default=False):
        raise _record_index_refused()
    return mode


def check_begin(mode: ConcurrencyMode, keeps_metadata: bool, write_config: WriteConfig,
                timeline: Timeline) -> None:
    """Refuse a non-blocking writer that keeps the metadata table, and does not drop its
    ``record_index``, when the table keeps one now (``timeline``: loaded under the lock,
    before the instant is created): another writer may have built it since this one was
    opened."""
    if mode is NBCC and keeps_metadata and write_config.record_index_enable is not False \
            and RECORD_INDEX.name in snapshot_declared(timeline):
        raise _record_index_refused()


def _keeps_record_index(write_config: WriteConfig, storage: Storage | None, *,
                        metadata_default: bool) -> bool:
    """Whether a writer with these options would keep the ``record_index`` (its option, or,
    unset, the table's when the writer keeps the metadata table; ``metadata_default``: whether
    it keeps one when ``hoodie.metadata.enable`` is unset)."""
    if write_config.index_type is IndexType.RECORD_INDEX:
        return True
    if write_config.record_index_enable is not None:
        return write_config.record_index_enable
    metadata = write_config.metadata_enable
    if not (metadata if metadata is not None else metadata_default) or storage is None:
        return False
    return RECORD_INDEX.name in declared_partitions(storage)


def _record_index_refused() -> InvalidOptionError:
    return InvalidOptionError(
        MODE_KEY, "NON_BLOCKING_CONCURRENCY_CONTROL writers cannot keep the metadata table's "
        "record_index (hoodie.metadata.record.index.enable, or a table that keeps one): each "
        "would compute its index entries from its own snapshot, and a key written by two of "
        "them at once could be left out. Hudi allows non-blocking writers with the simple "
        "bucket index only (hoodie.index.type=BUCKET); write with hoodie.write.concurrency."
        "mode=OPTIMISTIC_CONCURRENCY_CONTROL, or drop the index with "
        "hoodie.metadata.record.index.enable=false")
