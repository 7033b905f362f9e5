"""The ``files`` partition as one of the MDT's partitions (the shape of
:class:`~engine.metadata.indexes.IndexPartition`): the table's file listing, always kept while
the table keeps an MDT, one file group. Its records are :mod:`engine.metadata.files`'s (the
read side, which the view lists through); this module only says how the writer initialises
the partition from the table and what a commit adds to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.layout.file_group import TableFiles
from engine.metadata.files import change_of, listing_of
from engine.metadata.indexes import IndexPartition
from engine.metadata.keys import FILES as FILES_TYPE
from engine.metadata.records import MetadataRecord

if TYPE_CHECKING:
    from engine.config import WriteConfig
    from engine.layout.view import TableView
    from engine.metadata.update import MetadataUpdate
    from engine.timeline.active import Timeline
    from engine.timeline.instant import Instant

FILES = FILES_TYPE.name


def _build(view: TableView, _write_config: WriteConfig) -> list[MetadataRecord]:
    """The listing of every file of a completed instant the view sees (replaced ones too,
    until cleaned). Built while the table declares no MDT, so the view lists storage."""
    listed = view.list_table_files()
    return listing_of(TableFiles(
        tuple(f for f in listed.base_files if f.instant_time in view.visible),
        tuple(f for f in listed.log_files if f.instant_time in view.visible),
        listed.partitions))


def _sync(_data_timeline: Timeline, instant: Instant, content: bytes,
          _update: MetadataUpdate) -> MetadataUpdate:
    """The files a data action adds, and tombstones for those a clean or rollback removed."""
    from engine.metadata.update import MetadataUpdate

    update = MetadataUpdate()
    update.add(FILES, change_of(instant, content).records())
    return update


PARTITION = IndexPartition(FILES, lambda _c: True, lambda _view, _c: 1, _build, sync=_sync)

__all__ = ["FILES", "PARTITION"]
