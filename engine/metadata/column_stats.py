"""The ``column_stats`` partition of the metadata table (``hudi-metadata-table.md`` §4.3): for
every data file (base files and log files) and every indexed column, the column's min, max,
null count, value count and sizes: key ``B64(XXH64(column)) + B64(XXH64(partition)) +
B64(MD5(file name))``, payload ``HoodieMetadataColumnStats``. The stats themselves, and which
columns, are :mod:`engine.metadata.file_stats`'s; files a clean or rollback removed get the
same keys with ``isDeleted`` true.

Write handles put their file's records in :attr:`WriteStat.metadata`; files a commit names
without them (compaction and clustering base files) get theirs from their footer when the
commit syncs (:func:`_sync`), as Java's ``translateWriteStatToColumnStats`` reads the file
when a write stat carries no stats.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from engine.metadata.file_stats import (
    columns_to_index,
    configured_columns,
    file_stats,
    table_columns,
    table_file_stats,
)
from engine.metadata.index_defs import Definition, column_stats_definition, refresh
from engine.metadata.indexes import IndexPartition
from engine.metadata.keys import COLUMN_STATS as COLUMN_STATS_TYPE
from engine.metadata.records import ColumnStats, MetadataRecord, column_stats_record

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.layout.view import TableView
    from engine.metadata.update import MetadataUpdate
    from engine.timeline.active import Timeline
    from engine.timeline.instant import Instant

_log = logging.getLogger(__name__)

COLUMN_STATS = COLUMN_STATS_TYPE.name

__all__ = [
    "COLUMN_STATS",
    "PARTITION",
    "configured_columns",  # (the write client takes it from here)
    "deleted_records",
    "file_records",
    "handle_update",
]


def file_records(partition: str, file_name: str,
                 stats: Mapping[str, ColumnStats]) -> list[MetadataRecord]:
    """The column_stats records of one file."""
    return [column_stats_record(partition, file_name, c, s) for c, s in stats.items()]


def deleted_records(partition: str, file_name: str,
                    columns: Iterable[str]) -> list[MetadataRecord]:
    """Column_stats records marking a removed file's entries deleted (Java's
    ``HoodieColumnRangeMetadata.stub`` with ``isDeleted``)."""
    return [column_stats_record(partition, file_name, c,
                                ColumnStats(None, c, None, None, -1, -1, -1, -1, True))
            for c in columns]


def handle_update(partition: str, file_name: str,
                  stats: Mapping[str, ColumnStats]) -> MetadataUpdate:
    """What a write handle puts in its stat's ``metadata`` for the file it wrote."""
    from engine.metadata.update import MetadataUpdate

    update = MetadataUpdate()
    update.add(COLUMN_STATS, file_records(partition, file_name, stats))
    return update


# -- the partition ----------------------------------------------------------------------------

def _build(view: TableView, write_config: WriteConfig) -> list[MetadataRecord]:
    records: list[MetadataRecord] = []
    for (partition, name), stats in table_file_stats(view, write_config).items():
        records += file_records(partition, name, stats)
    return records


def _wanted(write_config: WriteConfig) -> bool | None:
    return write_config.column_stats_enable


def _sync(data_timeline: Timeline, instant: Instant, content: bytes,
                       update: MetadataUpdate) -> MetadataUpdate | None:
    """What a data action adds to column_stats beyond its handles' records: stats of the
    files its write stats name without them (read from the files), deleted entries for
    files a clean or rollback removed. Keeps the partition's definition
    (:mod:`engine.metadata.index_defs`) naming the columns the handles indexed."""
    from engine.metadata.files import change_of
    from engine.metadata.update import MetadataUpdate
    from engine.schema import table_schema

    change = change_of(instant, content)
    handled = [r.payload for r in update.upserts.get(COLUMN_STATS, ())
               if isinstance(r.payload, ColumnStats)]
    indexed = [p.column_name for p in handled if not p.is_deleted and p.column_name]
    if indexed:  # the definition names the columns the commit's files were indexed on
        refresh(data_timeline.storage, column_stats_definition(
            data_timeline.config.table_version, list(dict.fromkeys(indexed))))
    known = {p.file_name for p in handled}
    missing = [(p, n) for p, files in change.added.items() for n in files if n not in known]
    if not missing and not change.removed:
        return None
    schema = table_schema(data_timeline)
    if schema is None:
        return None
    columns = columns_to_index(schema, populate_meta_fields=data_timeline.config
                               .populate_meta_fields)
    out = MetadataUpdate()
    for partition, name in missing:
        try:
            stats = file_stats(data_timeline.storage, partition, name, columns, schema)
        except (OSError, ValueError) as exc:
            _log.warning("column stats of %s/%s: %s (left without stats)", partition, name,
                         exc)
            continue
        out.add(COLUMN_STATS, file_records(partition, name, stats))
    for partition, names in change.removed.items():
        for name in sorted(names):
            out.add(COLUMN_STATS, deleted_records(partition, name, columns))
    return out


def _definition(view: TableView, write_config: WriteConfig) -> Definition:
    return column_stats_definition(view.config.table_version,
                                   table_columns(view, write_config))


PARTITION = IndexPartition(COLUMN_STATS, _wanted, lambda _view, wc: wc.column_stats_file_groups,
                           _build, sync=_sync, definition=_definition)
